//! The plain-text report on stdout: the machine, every run with who spent the CPU, and the
//! summary of ratios (fencelock / reference) with the targets they are held to.

use std::fmt::Write as _;

use crate::bench::{Figures, LatencyOf, Outcome, Run};
use crate::load::Pattern;
use crate::plan::{BUSY, Block, Bound, CONNECTIONS, Side, StoreKey, count};
use crate::stats::{median, range};

/// The report, as printed.
pub fn render(o: &Outcome) -> String {
    let mut out = String::new();
    header(&mut out, o);
    out.push('\n');
    runs(&mut out, o);
    out.push('\n');
    summary(&mut out, o);
    out.push('\n');
    legend(&mut out, o);
    out
}

fn header(out: &mut String, o: &Outcome) {
    let s = &o.settings;
    let m = &o.machine;
    let _ = writeln!(out, "fencelock comparative benchmark");
    let mut facts = vec![
        (
            "machine",
            format!(
                "{} cores, {}, Linux {}, {:.1} GiB memory",
                m.cores, m.cpu_model, m.kernel, m.memory_gib
            ),
        ),
        (
            "server",
            format!(
                "{} ({}; {})",
                o.binary.path.display(),
                o.binary.version,
                o.binary.provenance
            ),
        ),
    ];
    if let Some(baseline) = &o.baseline {
        facts.push((
            "baseline",
            format!(
                "{} ({}; {})",
                baseline.path.display(),
                baseline.version,
                baseline.provenance
            ),
        ));
    }
    if let Some(pg) = &o.postgres {
        facts.push(("PostgreSQL", pg.clone()));
    }
    if s.only != Some(Block::Sqlite) {
        facts.push((
            "pgbench",
            o.pgbench.clone().unwrap_or_else(|| "not installed".into()),
        ));
    }
    if s.only != Some(Block::Postgres) {
        facts.push((
            "Redis",
            o.redis.clone().unwrap_or_else(|| "not installed".into()),
        ));
    }
    facts.push((
        "fdatasync",
        match &o.sync {
            Some(Ok(sync)) => format!(
                "{:.0}/s (4 KiB written in place + fdatasync, for 2 s, in {}; {})",
                sync.per_second,
                sync.dir.display(),
                match sync.same_fs_as_postgres {
                    Some(true) => "the file system of PostgreSQL's data directory too",
                    Some(false) => "NOT the file system of PostgreSQL's data directory",
                    None => "PostgreSQL's data directory could not be compared",
                }
            ),
            Some(Err(e)) => format!("not measured: {e}"),
            None => "not measured".into(),
        },
    ));
    facts.push((
        "runs",
        format!(
            "{} s measured each (fencelock and Redis after a {:.1} s warm-up; pgbench -T {}), {} round(s), \
             the sides of each row alternated; a fresh server process for every run",
            s.seconds,
            s.warmup.as_secs_f64(),
            s.seconds,
            s.rounds
        ),
    ));
    let elapsed = o.started.elapsed().as_secs();
    facts.push((
        "took",
        format!("{} min {:02} s", elapsed / 60, elapsed % 60),
    ));
    for (k, v) in facts {
        let _ = writeln!(out, "  {k:<11} {v}");
    }
    for note in &o.notes {
        let _ = writeln!(out, "  note        {note}");
    }
}

fn runs(out: &mut String, o: &Outcome) {
    let _ = writeln!(out, "Runs, in the order made");
    let mut table = Table::new(&[
        "#", "row", "rnd", "side", "rate/s", "won", "p50 ms", "p99 ms", "of", "cyc p99", "errors",
        "client", "server", "pg", "machine", "iowait", "peak RSS",
    ]);
    for (i, run) in o.runs.iter().enumerate() {
        let row = &o.rows[run.row];
        let mut cells = vec![
            (i + 1).to_string(),
            row.describe(),
            run.round.to_string(),
            run.side.describe(row.pattern, o.settings.live_leases),
        ];
        match &run.outcome {
            Ok(f) => cells.extend([
                thousands(f.rate),
                format!("{:.1}%", f.won_fraction * 100.0),
                f.latency.map_or("-".into(), |l| format!("{:.2}", l.p50_ms)),
                f.latency.map_or("-".into(), |l| format!("{:.2}", l.p99_ms)),
                match f.latency_of {
                    LatencyOf::Request => "req".into(),
                    LatencyOf::Cycle => "cycle".into(),
                },
                f.cycle_p99_ms.map_or("-".into(), |p| format!("{p:.2}")),
                f.errors.to_string(),
                format!("{:.2}", f.cpu.client),
                f.cpu.server.map_or("-".into(), |c| format!("{c:.2}")),
                f.cpu.database.map_or("-".into(), |c| format!("{c:.2}")),
                format!("{:.2}", f.cpu.machine_busy),
                format!("{:.2}", f.cpu.machine_iowait),
                f.peak_rss_kib.map_or("-".into(), mb),
            ]),
            Err(e) => cells.push(format!("FAILED: {}", first_line(e))),
        }
        table.push(cells);
    }
    out.push_str(&table.render());
    for run in &o.runs {
        if let Ok(Figures {
            error_note: Some(note),
            ..
        }) = &run.outcome
        {
            let _ = writeln!(
                out,
                "  errors in {}, round {}: {}",
                o.rows[run.row].describe(),
                run.round,
                first_line(note)
            );
        }
    }
}

/// A figure's target and whether the measured value meets it.
#[derive(Clone, Copy)]
enum Target {
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    /// The target, and whether `value` meets it; `unit` follows the bound.
    fn judge(self, value: Option<f64>, unit: &str) -> String {
        let (bound, met) = match self {
            Self::AtLeast(t) => (format!(">= {t}{unit}"), value.map(|v| v >= t)),
            Self::AtMost(t) => (format!("<= {t}{unit}"), value.map(|v| v <= t)),
        };
        match met {
            Some(true) => format!("{bound}: met"),
            Some(false) => format!("{bound}: NOT met"),
            None => bound,
        }
    }
}

struct Summary<'a> {
    o: &'a Outcome,
    table: Table,
}

impl Summary<'_> {
    fn row_index(&self, block: Block, pattern: Pattern, connections: usize) -> Option<usize> {
        self.o
            .rows
            .iter()
            .position(|r| r.block == block && r.pattern == pattern && r.connections == connections)
    }

    /// The successful runs of `side` in row `row`, with their rounds.
    fn figures(&self, row: usize, side: Side) -> Vec<(u32, &Figures)> {
        self.o
            .runs
            .iter()
            .filter(|r: &&Run| r.row == row && r.side == side)
            .filter_map(|r| r.outcome.as_ref().ok().map(|f| (r.round, f)))
            .collect()
    }

    /// A line of the summary: `a` against `b` in row `row` (none: not measured) on `figure`.
    fn compare(
        &mut self,
        what: String,
        row: Option<usize>,
        (a, b): (Side, Side),
        figure: Figure,
        target: Option<Target>,
    ) {
        let (fa, fb) = row.map_or((Vec::new(), Vec::new()), |r| {
            (self.figures(r, a), self.figures(r, b))
        });
        let cells = match figure {
            Figure::Rate(_) => rates(&fa, &fb, target),
            Figure::Latency => latencies(&fa, &fb, target),
        };
        let mut line = vec![what];
        line.extend(cells);
        self.table.push(line);
    }
}

/// The runs of one side, each with its round.
type Rounds<'a> = [(u32, &'a Figures)];

/// The rates of `a` and `b` (medians of the rounds), the ratio of medians with the range of
/// the per-round ratios, and the target.
fn rates(fa: &Rounds<'_>, fb: &Rounds<'_>, target: Option<Target>) -> [String; 4] {
    let va: Vec<f64> = fa.iter().map(|(_, f)| f.rate).collect();
    let vb: Vec<f64> = fb.iter().map(|(_, f)| f.rate).collect();
    let (ma, mb) = (median(&va), median(&vb));
    let ratio = ma.zip(mb).map(|(a, b)| a / b);
    let paired: Vec<f64> = fa
        .iter()
        .filter_map(|(round, f)| {
            let (_, g) = fb.iter().find(|(r, _)| r == round)?;
            Some(f.rate / g.rate)
        })
        .collect();
    let ratio_cell = match (ratio, range(&paired)) {
        (Some(r), Some((lo, hi))) if paired.len() > 1 => {
            format!("{r:.2} ({lo:.2}-{hi:.2})")
        }
        (Some(r), _) => format!("{r:.2}"),
        (None, _) => "-".into(),
    };
    [
        with_range(ma, &va),
        with_range(mb, &vb),
        ratio_cell,
        target.map_or(String::new(), |t| t.judge(ratio, "")),
    ]
}

/// p50 and p99 of `a` and `b` as "p50 / p99" cells, their ratios, and the target, which is
/// on p99.
fn latencies(fa: &Rounds<'_>, fb: &Rounds<'_>, target: Option<Target>) -> [String; 4] {
    let pick = |fs: &Rounds<'_>, p99: bool| {
        let v: Vec<f64> = fs
            .iter()
            .filter_map(|(_, f)| f.latency.map(|l| if p99 { l.p99_ms } else { l.p50_ms }))
            .collect();
        median(&v)
    };
    let (a50, a99, b50, b99) = (
        pick(fa, false),
        pick(fa, true),
        pick(fb, false),
        pick(fb, true),
    );
    let cell = |p50: Option<f64>, p99: Option<f64>, of: Option<LatencyOf>| match (p50, p99) {
        (Some(p50), Some(p99)) => format!(
            "{p50:.2} / {p99:.2} ms per {}",
            match of {
                Some(LatencyOf::Cycle) => "cycle",
                _ => "request",
            }
        ),
        _ => "-".into(),
    };
    let of = |fs: &Rounds<'_>| fs.first().map(|(_, f)| f.latency_of);
    let r50 = a50.zip(b50).map(|(a, b)| a / b);
    let r99 = a99.zip(b99).map(|(a, b)| a / b);
    [
        cell(a50, a99, of(fa)),
        cell(b50, b99, of(fb)),
        match (r50, r99) {
            (Some(r50), Some(r99)) => format!("{r50:.2} / {r99:.2}"),
            _ => "-".into(),
        },
        target.map_or(String::new(), |t| format!("p99 {}", t.judge(r99, ""))),
    ]
}

/// What a comparison of the summary is made on.
#[derive(Clone, Copy)]
enum Figure {
    /// Runs per second, named as printed (cycles, or won acquisitions on hot resources).
    Rate(&'static str),
    /// p50 and p99 latency; a target is on p99.
    Latency,
}

impl Figure {
    fn name(self) -> &'static str {
        match self {
            Self::Rate(name) => name,
            Self::Latency => "latency",
        }
    }
}

/// Lines of the summary, as `(what, block, pattern, sides, figure, counts, target)`: at each
/// connection count of `counts`, the plan row of `block` and `pattern` there, its `sides`
/// compared (first / second) on `figure`, held to what `target` gives for that count.
type Comparison = (
    String,
    Block,
    Pattern,
    (Side, Side),
    Figure,
    &'static [usize],
    fn(usize) -> Option<Target>,
);

/// The summary's lines, in the order printed: each store against its reference (the rate at
/// each connection count, then the latency), what the database alone does with fencelock's
/// writes against script A and against the store, then each store holding `leases` live
/// leases against itself empty. A table, laid out by hand; the targets are the performance
/// work's (the SQLite store's is against its HTTP floor, measured by `--floor`).
#[rustfmt::skip]
fn comparisons(leases: &str) -> [Comparison; 11] {
    use Block::{Postgres, Sqlite};
    use Figure::{Latency, Rate};
    use Pattern::{Cycles, Hot};
    use Side::{Fencelock, Pgbench, Redis};
    use StoreKey::{PostgresLoaded, SqliteLoaded};
    use Target::{AtLeast, AtMost};
    let (pg, sqlite) = (Fencelock(StoreKey::Postgres), Fencelock(StoreKey::Sqlite));
    let (pg_full, sqlite_full) = (Fencelock(PostgresLoaded), Fencelock(SqliteLoaded));
    let (rows, apply) = (Side::Bound(Bound::Rows), Side::Bound(Bound::Apply));
    let script_a = || "PostgreSQL store vs pgbench script A".to_owned();
    let script_b = || "PostgreSQL store vs pgbench script B, 10 hot resources".to_owned();
    let alone = |bound: Bound| format!("database alone, bounds/{} vs script A", bound.file());
    let redis = || "SQLite store vs Redis appendfsync always".to_owned();
    let full = |store: &str| format!("{store} store with {leases} live leases vs empty");
    let (each, busy): (&[usize], &[usize]) = (&CONNECTIONS, &[BUSY]);
    let cycles = Rate("cycles/s");
    [
        (script_a(), Postgres, Cycles, (pg, Pgbench), cycles, each, |c| Some(AtLeast(if c == 1 { 0.6 } else { 1.0 }))),
        (script_a(), Postgres, Cycles, (pg, Pgbench), Latency, each, |c| (c == BUSY).then_some(AtMost(1.5))),
        (script_b(), Postgres, Hot, (pg, Pgbench), Rate("won acquisitions/s"), busy, |_| Some(AtLeast(1.0))),
        (script_b(), Postgres, Hot, (pg, Pgbench), Latency, busy, |_| None),
        (alone(Bound::Rows), Postgres, Cycles, (rows, Pgbench), cycles, each, |_| None),
        (alone(Bound::Apply), Postgres, Cycles, (apply, Pgbench), cycles, each, |_| None),
        ("PostgreSQL store vs bounds/apply_1.sql".to_owned(), Postgres, Cycles, (pg, apply), cycles, each, |_| None),
        (redis(), Sqlite, Cycles, (sqlite, Redis), cycles, each, |_| None),
        (redis(), Sqlite, Cycles, (sqlite, Redis), Latency, each, |_| None),
        (full("SQLite"), Sqlite, Cycles, (sqlite_full, sqlite), cycles, busy, |_| Some(AtLeast(0.9))),
        (full("PostgreSQL"), Postgres, Cycles, (pg_full, pg), cycles, busy, |_| None),
    ]
}

fn summary(out: &mut String, o: &Outcome) {
    let _ = writeln!(
        out,
        "Summary: medians of the rounds; ratio = first side / second side (per-round range)"
    );
    let mut s = Summary {
        o,
        table: Table::new(&["what", "fencelock", "reference", "ratio", "target"]),
    };
    let comparisons = comparisons(&count(o.settings.live_leases));
    for (what, block, pattern, sides, figure, counts, target) in comparisons {
        if o.settings.only.is_some_and(|b| b != block) {
            continue;
        }
        for &c in counts {
            let row = s.row_index(block, pattern, c);
            let label = format!("{what}, {c} conn: {}", figure.name());
            s.compare(label, row, sides, figure, target(c));
        }
    }
    builds(&mut s);
    for (block, key) in [
        (Block::Postgres, StoreKey::Postgres),
        (Block::Sqlite, StoreKey::Sqlite),
    ] {
        if o.settings.only.is_some_and(|b| b != block) {
            continue;
        }
        let peak = s
            .row_index(block, Pattern::Cycles, 64)
            .map(|row| s.figures(row, Side::Fencelock(key)))
            .unwrap_or_default()
            .iter()
            .filter_map(|(_, f)| f.peak_rss_kib)
            .max();
        s.table.push(vec![
            format!(
                "{} store: server peak RSS after the 64-connection runs",
                key.store_name()
            ),
            peak.map_or("-".into(), mb),
            String::new(),
            String::new(),
            Target::AtMost(50.0).judge(peak.map(|k| k as f64 / 1024.0), " MB"),
        ]);
        let idle = o
            .idle
            .iter()
            .find(|i| i.store == key)
            .and_then(|i| i.outcome.as_ref().ok().copied());
        s.table.push(vec![
            format!(
                "{} store: server peak RSS with {} idle connections",
                key.store_name(),
                o.settings.idle_connections
            ),
            idle.map_or("-".into(), mb),
            String::new(),
            String::new(),
            Target::AtMost(50.0).judge(idle.map(|k| k as f64 / 1024.0), " MB"),
        ]);
    }
    out.push_str(&s.table.render());
    for i in &o.idle {
        if let Err(e) = &i.outcome {
            let _ = writeln!(
                out,
                "  idle connections on the {} store FAILED: {}",
                i.store.store_name(),
                first_line(e)
            );
        }
    }
}

/// The lines of the two builds: in every row where the baseline build ran, this build against
/// it, on the row's rate and on latency.
fn builds(s: &mut Summary<'_>) {
    let o = s.o;
    for (index, row) in o.rows.iter().enumerate() {
        let Some(key) = row.sides.iter().find_map(|side| match side {
            Side::Baseline(key) => Some(*key),
            _ => None,
        }) else {
            continue;
        };
        let (load, rate) = match row.pattern {
            Pattern::Cycles => (String::new(), Figure::Rate("cycles/s")),
            Pattern::Hot => (
                ", 10 hot resources".to_owned(),
                Figure::Rate("won acquisitions/s"),
            ),
        };
        for figure in [rate, Figure::Latency] {
            let label = format!(
                "{} store, this build vs baseline build{load}, {} conn: {}",
                key.store_name(),
                row.connections,
                figure.name()
            );
            let sides = (Side::Fencelock(key), Side::Baseline(key));
            s.compare(label, Some(index), sides, figure, None);
        }
    }
}

fn legend(out: &mut String, o: &Outcome) {
    let lines = [
        "A cycle is one acquire plus one release. fencelock runs over HTTP/1.1 keep-alive, one connection per client, each \
         client acquiring a random resource of 10,000 (res:<n>) for a fresh random owner and releasing it; pgbench runs the \
         same upsert and owner-checked delete (benches/reference/), one cycle per transaction; Redis runs SET NX PX and the \
         compare-and-delete script (EVALSHA).",
        "Bounds: pgbench sends fencelock's own writes straight to a database of fencelock's schema \
         (benches/reference/bounds/): rows_1.sql appends and ends the lease rows with plain statements, apply_1.sql calls \
         fencelock_apply once per request, as a batch of one; what the database alone does, with no server in front.",
        "Hot: 10 resources; a fencelock client releases only what it won, pgbench's script B always runs its delete; won \
         acquisitions are counted (pgbench: the deletes on its table, n_tup_del).",
        "won: won acquisitions among attempts (near 100% over 10,000 resources: this checks the pgbench count). \
         Latency per request (fencelock, Redis) or per transaction = cycle (pgbench); cyc p99: per cycle.",
        "CPU in cores (CPU seconds per second of the measured window): client = the load generator (this process, \
         getrusage) or pgbench; server = fencelock or redis-server (/proc/PID/stat); pg = PostgreSQL's processes \
         (PostgreSQL rows); machine = every process (/proc/stat), any other work on the machine included: near the \
         core count, the machine was saturated and the figures are noisy.",
    ];
    for line in lines {
        let _ = writeln!(out, "{}", wrap(line, 100));
    }
    if o.baseline.is_some() {
        let line = "this build vs baseline build: the build given with --baseline-bin ran on stores of its own, \
                    its runs alternated with the others; its figures stand in the reference column.";
        let _ = writeln!(out, "{}", wrap(line, 100));
    }
    let _ = writeln!(
        out,
        "Measured with {} live leases where said; peak RSS is the server's VmHWM.",
        count(o.settings.live_leases)
    );
}

/// `rate` with thousands separators, no decimals.
fn thousands(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let digits = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 { format!("-{out}") } else { out }
}

/// A median with the range of the rounds it came from.
fn with_range(m: Option<f64>, values: &[f64]) -> String {
    match (m, range(values)) {
        (Some(m), Some((lo, hi))) if values.len() > 1 => {
            format!("{} ({}-{})", thousands(m), thousands(lo), thousands(hi))
        }
        (Some(m), _) => thousands(m),
        (None, _) => "-".into(),
    }
}

fn mb(kib: u64) -> String {
    format!("{:.1} MB", kib as f64 / 1024.0)
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > width {
            out.push_str(&line);
            out.push('\n');
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    out.push_str(&line);
    out
}

/// Columns padded to their widest cell; the first columns of text left-aligned, figures
/// right-aligned.
struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[&str]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
    }

    fn render(&self) -> String {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(String::len).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                // A last cell that is longer (a failure) does not widen its column.
                if !(i == row.len() - 1 && row.len() < columns) {
                    widths[i] = widths[i].max(cell.len());
                }
            }
        }
        let numeric = |i: usize, cell: &str| {
            i > 0 && cell.starts_with(|c: char| c.is_ascii_digit() || c == '-')
        };
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            let mut text = String::new();
            for (i, cell) in cells.iter().enumerate() {
                let w = widths.get(i).copied().unwrap_or(0);
                if i + 1 == cells.len() && i + 1 < columns {
                    text.push_str(cell);
                } else if numeric(i, cell) {
                    let _ = write!(text, "{cell:>w$}");
                } else {
                    let _ = write!(text, "{cell:<w$}");
                }
                text.push_str("  ");
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&self.header, &mut out);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule, &mut out);
        for row in &self.rows {
            line(row, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_separated() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(f64::NAN), "-");
    }

    #[test]
    fn targets_say_whether_they_are_met() {
        assert_eq!(Target::AtLeast(0.8).judge(Some(0.85), ""), ">= 0.8: met");
        assert_eq!(Target::AtLeast(1.0).judge(Some(0.48), ""), ">= 1: NOT met");
        assert_eq!(
            Target::AtMost(50.0).judge(Some(12.0), " MB"),
            "<= 50 MB: met"
        );
        assert_eq!(Target::AtMost(1.5).judge(None, ""), "<= 1.5");
    }

    /// The full plan with nothing measured, with or without a baseline build.
    fn unmeasured(baseline: bool) -> Outcome {
        let settings = crate::bench::Settings {
            seconds: 3,
            rounds: 1,
            warmup: std::time::Duration::ZERO,
            live_leases: 1_000_000,
            idle_connections: 1000,
            only: None,
            keep_temp: false,
        };
        let binary = crate::fencelock::Binary {
            path: "fencelock".into(),
            provenance: String::new(),
            version: String::new(),
        };
        Outcome {
            settings,
            machine: crate::machine::Machine::read(),
            sync: None,
            baseline: baseline.then(|| binary.clone()),
            binary,
            postgres: None,
            pgbench: None,
            redis: None,
            notes: Vec::new(),
            rows: crate::plan::rows(None, baseline),
            runs: Vec::new(),
            idle: Vec::new(),
            started: std::time::Instant::now(),
        }
    }

    /// Each line of the summary: its first cell and its target, if it has one.
    fn summary_lines(o: &Outcome) -> Vec<String> {
        let mut out = String::new();
        summary(&mut out, o);
        out.lines()
            .skip(3)
            .map(|line| {
                let cells: Vec<&str> = line.split("  ").map(str::trim).collect();
                let target = cells.last().filter(|c| c.contains("= ")).copied();
                let line = format!("{} | {}", cells[0], target.unwrap_or_default());
                line.trim_end().to_owned()
            })
            .collect()
    }

    /// The full plan with nothing measured: the summary's lines and their targets.
    #[test]
    fn the_summary_lists_every_comparison_in_order() {
        let lines = summary_lines(&unmeasured(false));
        let expected = "\
PostgreSQL store vs pgbench script A, 1 conn: cycles/s | >= 0.6
PostgreSQL store vs pgbench script A, 16 conn: cycles/s | >= 1
PostgreSQL store vs pgbench script A, 64 conn: cycles/s | >= 1
PostgreSQL store vs pgbench script A, 1 conn: latency |
PostgreSQL store vs pgbench script A, 16 conn: latency | p99 <= 1.5
PostgreSQL store vs pgbench script A, 64 conn: latency |
PostgreSQL store vs pgbench script B, 10 hot resources, 16 conn: won acquisitions/s | >= 1
PostgreSQL store vs pgbench script B, 10 hot resources, 16 conn: latency |
database alone, bounds/rows_1.sql vs script A, 1 conn: cycles/s |
database alone, bounds/rows_1.sql vs script A, 16 conn: cycles/s |
database alone, bounds/rows_1.sql vs script A, 64 conn: cycles/s |
database alone, bounds/apply_1.sql vs script A, 1 conn: cycles/s |
database alone, bounds/apply_1.sql vs script A, 16 conn: cycles/s |
database alone, bounds/apply_1.sql vs script A, 64 conn: cycles/s |
PostgreSQL store vs bounds/apply_1.sql, 1 conn: cycles/s |
PostgreSQL store vs bounds/apply_1.sql, 16 conn: cycles/s |
PostgreSQL store vs bounds/apply_1.sql, 64 conn: cycles/s |
SQLite store vs Redis appendfsync always, 1 conn: cycles/s |
SQLite store vs Redis appendfsync always, 16 conn: cycles/s |
SQLite store vs Redis appendfsync always, 64 conn: cycles/s |
SQLite store vs Redis appendfsync always, 1 conn: latency |
SQLite store vs Redis appendfsync always, 16 conn: latency |
SQLite store vs Redis appendfsync always, 64 conn: latency |
SQLite store with 10^6 live leases vs empty, 16 conn: cycles/s | >= 0.9
PostgreSQL store with 10^6 live leases vs empty, 16 conn: cycles/s |
PostgreSQL store: server peak RSS after the 64-connection runs | <= 50 MB
PostgreSQL store: server peak RSS with 1000 idle connections | <= 50 MB
SQLite store: server peak RSS after the 64-connection runs | <= 50 MB
SQLite store: server peak RSS with 1000 idle connections | <= 50 MB";
        assert_eq!(lines, expected.lines().collect::<Vec<_>>());
    }

    /// With a baseline build, the two builds are compared in every row it ran in, after the
    /// references and with no target.
    #[test]
    fn a_baseline_build_gets_a_line_per_row_and_figure() {
        let without = summary_lines(&unmeasured(false));
        let with = summary_lines(&unmeasured(true));
        let builds: Vec<&str> = with
            .iter()
            .filter(|line| !without.contains(line))
            .map(String::as_str)
            .collect();
        let expected = "\
PostgreSQL store, this build vs baseline build, 1 conn: cycles/s |
PostgreSQL store, this build vs baseline build, 1 conn: latency |
PostgreSQL store, this build vs baseline build, 16 conn: cycles/s |
PostgreSQL store, this build vs baseline build, 16 conn: latency |
PostgreSQL store, this build vs baseline build, 64 conn: cycles/s |
PostgreSQL store, this build vs baseline build, 64 conn: latency |
PostgreSQL store, this build vs baseline build, 10 hot resources, 16 conn: won acquisitions/s |
PostgreSQL store, this build vs baseline build, 10 hot resources, 16 conn: latency |
SQLite store, this build vs baseline build, 1 conn: cycles/s |
SQLite store, this build vs baseline build, 1 conn: latency |
SQLite store, this build vs baseline build, 16 conn: cycles/s |
SQLite store, this build vs baseline build, 16 conn: latency |
SQLite store, this build vs baseline build, 64 conn: cycles/s |
SQLite store, this build vs baseline build, 64 conn: latency |";
        assert_eq!(builds, expected.lines().collect::<Vec<_>>());
        // Everything else is as without it, in the same order.
        let rest: Vec<&String> = with.iter().filter(|l| without.contains(l)).collect();
        assert_eq!(rest, without.iter().collect::<Vec<_>>());
    }

    #[test]
    fn tables_align_their_columns() {
        let mut t = Table::new(&["what", "n"]);
        t.push(vec!["a".into(), "1,000".into()]);
        t.push(vec!["longer".into(), "7".into()]);
        assert_eq!(
            t.render(),
            "what    n\n------  -----\na       1,000\nlonger      7\n"
        );
    }
}
