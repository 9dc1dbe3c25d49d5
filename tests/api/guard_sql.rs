//! The guard at the database, on PostgreSQL: the SQL `fencelock guard sql postgres` prints
//! and `fencelock guard install` applies, and `fencelock_guard.admit` called as a service in
//! any language calls it, in a transaction of its own. Each test has a fresh database.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use fencelock::domain::{Fence, FenceKey, FenceKeys};
use fencelock::guard::{self, Admission, FencingToken, Guard, GuardError, GuardMetrics};
use fencelock::metrics::Registry;
use serde_json::Value;
use tokio_postgres::GenericClient;

use crate::helpers::{
    StoreKind, TestDb, admin, assert_succeeded, client, eventually, lock_waiters, pg_connect,
};
use crate::process::{self, ServerProcess};

const ADMIT: &str = "SELECT fencelock_guard.admit($1, $2)";

/// Tokens that are none (`FL400`, whether or not keys are installed), on either database: a
/// fence must be a positive integer below 2^53 in plain decimal, a signature 43 characters of
/// unpadded base64url that decode to 32 bytes (the last one here does not).
pub const NOT_TOKENS: [&str; 15] = [
    "abc",
    "",
    "0",
    "05",
    "+5",
    "-5",
    " 5",
    "5 ",
    "5\n",
    "5.0",
    "1e3",
    "9007199254740992",
    "5.",
    "5.abc",
    "5.aiUUz8qOOQ-xdbI2ghUN65XfxGfXvgwLUXY2UwDDRK1",
];

/// What is no token at all where `token` (a lease's `fence_token`) would be admitted:
/// [`NOT_TOKENS`], and `token` respelled, padded, cut or doubled. `FL400` with keys installed
/// as without, never `FL403`.
pub fn not_tokens_like(token: &str) -> Vec<String> {
    let signature = token.split_once('.').unwrap().1;
    let mut not_tokens: Vec<String> = NOT_TOKENS.iter().map(|t| (*t).to_owned()).collect();
    not_tokens.extend([
        "garbage".to_owned(),
        // The fence in a token is read only in the spelling the server signs.
        format!("0{token}"),
        format!("+{token}"),
        format!(" {token}"),
        format!("{token}\n"),
        format!("{token}A"),
        token[..token.len() - 1].to_owned(),
        format!("{token}.{signature}"),
        format!(".{signature}"),
        signature.to_owned(),
    ]);
    not_tokens
}

/// `fencelock guard ARGS...`, run to its end in `dir`: its stdout.
pub fn guard_command(dir: &Path, args: &[&str]) -> String {
    let args: Vec<&str> = ["guard"].iter().chain(args).copied().collect();
    assert_succeeded(&process::run(dir, &args), &format!("fencelock {args:?}"))
}

/// A key file of 32 random bytes in `dir`, and the key.
pub fn key_file(dir: &Path, name: &str) -> (PathBuf, FenceKey) {
    let path = dir.join(name);
    std::fs::write(&path, rand::random::<[u8; 32]>()).unwrap();
    let key = FenceKey::read(&path).unwrap();
    (path, key)
}

/// The `fence_token` and fence of a lease on `resource` from a lease server started (in
/// `dir`, on SQLite) with `--fence-key key_file`.
pub async fn signed_lease(dir: &Path, key_file: &Path, resource: &str) -> (String, i64) {
    let server = ServerProcess::start_with(None, dir, &["--fence-key", key_file.to_str().unwrap()]);
    let answer: Value = server
        .acquire(&client(), resource, "worker")
        .await
        .json()
        .await
        .unwrap();
    let lock = &answer["lock"];
    let token = lock["fence_token"].as_str().expect("a fence_token");
    (token.to_owned(), lock["fence"].as_i64().unwrap())
}

/// `token` with the last character of its signature changed, still well-formed.
pub fn tampered(token: &str) -> String {
    let (kept, last) = token.split_at(token.len() - 1);
    format!("{kept}{}", if last == "A" { 'E' } else { 'A' })
}

/// A fresh database, a session on it, and a scratch folder for key files.
struct Guarded {
    db: Arc<TestDb>,
    session: tokio_postgres::Client,
    dir: tempfile::TempDir,
}

impl Guarded {
    /// A fresh database with the printed SQL applied (with the keys of `key_files`).
    async fn new(key_files: &[&str]) -> Self {
        let guarded = Self::empty().await;
        guarded.apply(key_files).await;
        guarded
    }

    async fn empty() -> Self {
        let db = TestDb::new(StoreKind::Postgres).await;
        let session = pg_connect(&db.url()).await;
        let dir = tempfile::tempdir().unwrap();
        Self { db, session, dir }
    }

    /// Applies the SQL `fencelock guard sql postgres` prints with `--fence-key` for each of
    /// `key_files` (in the scratch folder), as a script is applied: all of it at once.
    async fn apply(&self, key_files: &[&str]) {
        let sql = self.guard_sql(key_files);
        self.session
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("applying the printed SQL: {e:?}"));
    }

    fn guard_sql(&self, key_files: &[&str]) -> String {
        let mut args = vec!["sql", "postgres"];
        for file in key_files {
            args.extend(["--fence-key", file]);
        }
        guard_command(self.dir.path(), &args)
    }

    fn key_file(&self, name: &str) -> FenceKey {
        key_file(self.dir.path(), name).1
    }

    async fn fence_of(&self, key: &str) -> Option<i64> {
        let row = self
            .session
            .query_opt(
                "SELECT fence FROM fencelock_guard.fences WHERE key = $1",
                &[&key],
            )
            .await
            .unwrap();
        row.map(|row| row.get(0))
    }

    async fn rows(&self, table: &str) -> i64 {
        let sql = format!("SELECT count(*) FROM {table}");
        self.session.query_one(&sql, &[]).await.unwrap().get(0)
    }

    async fn installed_keys(&self) -> Vec<Vec<u8>> {
        let rows = self
            .session
            .query(
                "SELECT secret FROM fencelock_guard.fence_keys ORDER BY secret",
                &[],
            )
            .await
            .unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    }
}

/// What `fencelock_guard.admit` answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Admitted(i64),
    Refused {
        code: String,
        message: String,
        detail: Option<String>,
    },
}

impl Answer {
    /// The refusal's message and detail, which must have `code`.
    #[track_caller]
    fn refused(self, code: &str) -> (String, Option<String>) {
        match self {
            Self::Refused {
                code: got,
                message,
                detail,
            } if got == code => (message, detail),
            other => panic!("expected a refusal with SQLSTATE {code}, got {other:?}"),
        }
    }
}

async fn admit(session: &impl GenericClient, key: &str, token: &str) -> Answer {
    match session.query_one(ADMIT, &[&key, &token]).await {
        Ok(row) => Answer::Admitted(row.get(0)),
        Err(e) => {
            let db = e
                .as_db_error()
                .unwrap_or_else(|| panic!("admit({key:?}, {token:?}) failed: {e:?}"));
            Answer::Refused {
                code: db.code().code().to_owned(),
                message: db.message().to_owned(),
                detail: db.detail().map(str::to_owned),
            }
        }
    }
}

/// The printed SQL applies twice; `admit` takes a fence at least the highest and refuses a
/// lower one (naming the current fence) and anything that is not a fence, by SQLSTATE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_applies_twice_and_admits_by_the_fence() {
    let guarded = Guarded::new(&[]).await;
    guarded.apply(&[]).await;
    let session = &guarded.session;

    assert_eq!(admit(session, "report", "5").await, Answer::Admitted(5));
    // Equal: one holder writes many times.
    assert_eq!(admit(session, "report", "5").await, Answer::Admitted(5));
    let (message, detail) = admit(session, "report", "3").await.refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    assert_eq!(detail.as_deref(), Some("5"));
    for garbage in NOT_TOKENS {
        let (message, _) = admit(session, "report", garbage).await.refused("FL400");
        assert!(message.starts_with("not a fence token"), "{message}");
    }
    // Keys are independent, and a greater fence is admitted and becomes the highest.
    assert_eq!(admit(session, "other", "1").await, Answer::Admitted(1));
    assert_eq!(
        admit(session, "report", "9007199254740991").await,
        Answer::Admitted(9_007_199_254_740_991)
    );
    assert_eq!(
        guarded.fence_of("report").await,
        Some(9_007_199_254_740_991)
    );
    // Without keys, the fence of a well-formed token is taken as it is (keys being rolled
    // out: the lease server signs before the guard checks).
    let token = FenceKey::from_bytes(vec![7; 32])
        .unwrap()
        .sign("late", Fence::new(42).unwrap());
    assert_eq!(admit(session, "late", &token).await, Answer::Admitted(42));
    let key = None::<&str>;
    let null_key = session.query_one(ADMIT, &[&key, &"1"]).await.unwrap_err();
    assert_eq!(null_key.code().unwrap().code(), "FL400");
}

/// The call in a transaction: a refusal ends the transaction, so nothing of it is written,
/// not even what it wrote before the call; an admitted fence is recorded only with the
/// transaction's commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_admit_leaves_nothing_of_its_transaction() {
    let mut guarded = Guarded::new(&[]).await;
    guarded
        .session
        .batch_execute("CREATE TABLE docs (key text PRIMARY KEY, body text NOT NULL)")
        .await
        .unwrap();
    assert_eq!(
        admit(&guarded.session, "doc", "5").await,
        Answer::Admitted(5)
    );

    let tx = guarded.session.transaction().await.unwrap();
    // Written before the call, the worst order, to show that even this is undone.
    tx.execute("INSERT INTO docs VALUES ('doc', 'by fence 3')", &[])
        .await
        .unwrap();
    admit(&tx, "doc", "3").await.refused("FL409");
    // PostgreSQL answers COMMIT in an aborted transaction with ROLLBACK.
    tx.commit().await.unwrap();
    assert_eq!(guarded.rows("docs").await, 0);
    assert_eq!(guarded.fence_of("doc").await, Some(5));

    // An admitted fence rolled back with its transaction was never admitted.
    let tx = guarded.session.transaction().await.unwrap();
    assert_eq!(admit(&tx, "doc", "8").await, Answer::Admitted(8));
    tx.rollback().await.unwrap();
    assert_eq!(guarded.fence_of("doc").await, Some(5));
}

/// `fencelock guard install` applies the same SQL; with `--fence-key` the installed keys are
/// exactly those given (rotation: new and old, then new alone); without, they stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_install_installs_exactly_the_keys_given() {
    let guarded = Guarded::empty().await;
    let dir = guarded.dir.path();
    let (old_file, old) = key_file(dir, "old.key");
    let (new_file, new) = key_file(dir, "new.key");
    let url = guarded.db.url();
    let install = |files: &[&Path]| {
        let mut args = vec!["install", "--database-url", &url];
        for file in files {
            args.extend(["--fence-key", file.to_str().unwrap()]);
        }
        let output = process::run(dir, &["guard"].into_iter().chain(args).collect::<Vec<_>>());
        assert_succeeded(&output, "fencelock guard install");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let said = install(&[&old_file]);
    assert!(
        said.starts_with("fencelock guard: installed into "),
        "{said}"
    );
    assert!(
        !said.contains("fencelock-ci"),
        "the password is not shown: {said}"
    );
    let signed = |key: &FenceKey, fence| key.sign("job", Fence::new(fence).unwrap());
    assert_eq!(guarded.installed_keys().await.len(), 1);
    let session = &guarded.session;
    assert_eq!(
        admit(session, "job", &signed(&old, 1)).await,
        Answer::Admitted(1)
    );
    admit(session, "job", &signed(&new, 2))
        .await
        .refused("FL403");

    install(&[&new_file, &old_file]);
    assert_eq!(
        admit(session, "job", &signed(&old, 2)).await,
        Answer::Admitted(2)
    );
    assert_eq!(
        admit(session, "job", &signed(&new, 3)).await,
        Answer::Admitted(3)
    );

    install(&[&new_file]);
    admit(session, "job", &signed(&old, 4))
        .await
        .refused("FL403");
    assert_eq!(
        admit(session, "job", &signed(&new, 4)).await,
        Answer::Admitted(4)
    );

    // Without --fence-key, the installed key stays: no bare fence gets in.
    let said = install(&[]);
    assert!(said.contains("left as they were"), "{said}");
    assert_eq!(guarded.installed_keys().await.len(), 1);
    admit(session, "job", "5").await.refused("FL403");
    assert_eq!(guarded.fence_of("job").await, Some(4));
}

/// With the lease server's key installed, the `fence_token` the server gives (it was
/// started with `--fence-key`) is admitted for its resource only; a bare fence, a tampered
/// signature and another key's signature are refused (`FL403`), and what is no token at all
/// is `FL400`, as without keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keys_only_the_lease_servers_token_for_its_resource_is_admitted() {
    let guarded = Guarded::empty().await;
    let (file, key) = key_file(guarded.dir.path(), "fence.key");
    guarded.apply(&["fence.key"]).await;
    guarded.apply(&["fence.key"]).await;
    let (token, fence) = signed_lease(guarded.dir.path(), &file, "ledger").await;
    let token = token.as_str();
    let session = &guarded.session;

    let (message, _) = admit(session, "another", token).await.refused("FL403");
    assert!(
        message.contains("not signed by an installed key"),
        "{message}"
    );
    let (message, _) = admit(session, "ledger", &fence.to_string())
        .await
        .refused("FL403");
    assert!(message.contains("bare fence"), "{message}");
    admit(session, "ledger", &tampered(token))
        .await
        .refused("FL403");
    let forged = FenceKey::from_bytes(vec![1; 32])
        .unwrap()
        .sign("ledger", Fence::new(fence).unwrap());
    admit(session, "ledger", &forged).await.refused("FL403");
    // What is no token at all is FL400 with keys as without: a malformed request, not a
    // token some key might have signed.
    let not_tokens = not_tokens_like(token);
    for garbage in &not_tokens {
        let (message, _) = admit(session, "ledger", garbage).await.refused("FL400");
        assert!(
            message.starts_with("not a fence token"),
            "{garbage:?}: {message}"
        );
    }
    assert_eq!(guarded.fence_of("ledger").await, None);

    assert_eq!(
        admit(session, "ledger", token).await,
        Answer::Admitted(fence)
    );
    // The Rust guard with the same key agrees: 403 where the database says FL403, 400 where
    // it says FL400 (but for the whitespace around a header, which is not part of it).
    let keys = FenceKeys::new(vec![key]);
    assert_eq!(keys.verify("ledger", token).map(Fence::get), Ok(fence));
    let rust = Guard::new(keys, GuardMetrics::register(&Registry::new()));
    let check = |token: &str| rust.check("ledger", &FencingToken::new(token));
    assert_eq!(check(token).unwrap().fence().get(), fence);
    for refused in [
        check(&fence.to_string()),
        check(&tampered(token)),
        check(&forged),
    ] {
        let refused = refused.unwrap_err();
        assert!(
            matches!(refused, GuardError::InvalidToken(_)),
            "{refused:?}"
        );
    }
    let refused = rust
        .check("another", &FencingToken::new(token))
        .unwrap_err();
    assert!(
        matches!(refused, GuardError::InvalidToken(_)),
        "{refused:?}"
    );
    for garbage in not_tokens.iter().filter(|t| t.trim() == t.as_str()) {
        let refused = check(garbage).unwrap_err();
        assert!(
            matches!(refused, GuardError::NotAToken(_)),
            "{garbage:?}: {refused:?}"
        );
        assert_eq!(refused.status().as_u16(), 400, "{garbage:?}");
    }
}

/// A role that was granted nothing may call `admit` (it runs as the guard's owner), but
/// cannot read the keys, change a fence, or call the guard's helpers; a grant on the keys
/// given to a role by hand is taken back when the SQL is applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_grants_can_admit_but_cannot_read_the_keys() {
    let guarded = Guarded::empty().await;
    guarded.key_file("fence.key");
    guarded.apply(&["fence.key"]).await;
    let role = TestRole::create(&guarded.db).await;
    let session = &guarded.session;
    session
        .batch_execute(&format!("SET ROLE {}", role.name))
        .await
        .unwrap();

    // With a key installed, a bare fence is refused, which the role is told by SQLSTATE.
    admit(session, "k", "5").await.refused("FL403");
    let key = FenceKey::read(&guarded.dir.path().join("fence.key")).unwrap();
    let token = key.sign("k", Fence::new(5).unwrap());
    assert_eq!(admit(session, "k", &token).await, Answer::Admitted(5));
    for sql in [
        "SELECT count(*) FROM fencelock_guard.fence_keys",
        "UPDATE fencelock_guard.fences SET fence = 1",
        "DELETE FROM fencelock_guard.fences",
        "SELECT fencelock_guard.fence_of('k', '5')",
        "SELECT fencelock_guard.hmac_sha256('\\x00', '\\x00')",
        "CREATE TABLE fencelock_guard.mine (x int)",
    ] {
        let refused = session.batch_execute(sql).await.unwrap_err();
        assert_eq!(
            refused.code().map(|c| c.code()),
            Some("42501"),
            "{sql}: {refused:?}"
        );
    }
    session.batch_execute("RESET ROLE").await.unwrap();
    assert_eq!(guarded.fence_of("k").await, Some(5));

    session
        .batch_execute(&format!(
            "GRANT SELECT ON fencelock_guard.fence_keys TO {}",
            role.name
        ))
        .await
        .unwrap();
    guarded.apply(&[]).await;
    session
        .batch_execute(&format!("SET ROLE {}", role.name))
        .await
        .unwrap();
    let refused = session
        .batch_execute("SELECT count(*) FROM fencelock_guard.fence_keys")
        .await
        .unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"));
    session.batch_execute("RESET ROLE").await.unwrap();
}

/// A role of the test's own, with no grants, dropped with it. Roles belong to the whole
/// server, not to the test's database.
struct TestRole {
    name: String,
    database: String,
}

impl TestRole {
    async fn create(db: &TestDb) -> Self {
        let name = format!("fencelock_plain_{:016x}", rand::random::<u64>());
        admin()
            .await
            .batch_execute(&format!("CREATE ROLE {name} NOLOGIN"))
            .await
            .unwrap();
        Self {
            name,
            database: db.url(),
        }
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let (name, database) = (self.name.clone(), self.database.clone());
        let dropped = on_a_thread_of_its_own(async move {
            // What the role was granted in the test's database goes first.
            pg_connect(&database)
                .await
                .batch_execute(&format!("DROP OWNED BY {name}"))
                .await?;
            admin()
                .await
                .batch_execute(&format!("DROP ROLE IF EXISTS {name}"))
                .await
        });
        if let Err(e) = dropped {
            eprintln!("could not drop test role {}: {e}", self.name);
        }
    }
}

/// Runs `work` to its end on a thread and runtime of its own: for a `Drop`, which runs
/// inside the test's runtime and cannot block on it. A panic there is passed on.
pub fn on_a_thread_of_its_own<T: Send + 'static>(
    work: impl Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Two transactions admitting fences for one key: the second waits inside PostgreSQL for
/// the first to commit, then sees the fence the first admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactions_on_one_key_serialize() {
    let mut guarded = Guarded::new(&[]).await;
    let url = guarded.db.url();
    let first = guarded.session.transaction().await.unwrap();
    assert_eq!(admit(&first, "k", "5").await, Answer::Admitted(5));

    let second = tokio::spawn(async move {
        let mut session = pg_connect(&url).await;
        let tx = session.transaction().await.unwrap();
        let answer = admit(&tx, "k", "4").await;
        drop(tx);
        answer
    });
    let watcher = pg_connect(&guarded.db.url()).await;
    eventually(
        "the second transaction waits for the key's row",
        Duration::from_secs(20),
        async || lock_waiters(&watcher).await == 1,
    )
    .await;
    assert!(!second.is_finished(), "the second admit did not wait");

    first.commit().await.unwrap();
    let (message, detail) = second.await.unwrap().refused("FL409");
    assert!(message.contains("the current fence is 5"), "{message}");
    assert_eq!(detail.as_deref(), Some("5"));
}

/// The rows of the table an earlier version of the Rust guard kept (`fence_guard`) are
/// carried over on install, so that an upgrade admits no writer they had stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_the_fences_of_the_earlier_table() {
    let guarded = Guarded::empty().await;
    guarded
        .session
        .batch_execute(
            "CREATE TABLE fence_guard (key text PRIMARY KEY, fence bigint NOT NULL,
                 updated_at timestamptz NOT NULL DEFAULT now());
             INSERT INTO fence_guard (key, fence) VALUES ('old', 9)",
        )
        .await
        .unwrap();
    guarded.apply(&[]).await;
    let (message, _) = admit(&guarded.session, "old", "8").await.refused("FL409");
    assert!(message.contains("the current fence is 9"), "{message}");
    assert_eq!(
        admit(&guarded.session, "old", "10").await,
        Answer::Admitted(10)
    );
    // Applied again, the old table's lower fence does not lower the guard's.
    guarded.apply(&[]).await;
    assert_eq!(guarded.fence_of("old").await, Some(10));
}

/// The psql example of the library's documentation (`fencelock::guard::sql`), as it is
/// there, does what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_psql_example_works() {
    let guarded = Guarded::new(&[]).await;
    let example = documented_example("BEGIN;");
    guarded
        .session
        .batch_execute(
            "CREATE TABLE invoices (id int PRIMARY KEY, total int NOT NULL);
             INSERT INTO invoices VALUES (7, 100)",
        )
        .await
        .unwrap();
    guarded.session.batch_execute(&example).await.unwrap();
    let total: i32 = guarded
        .session
        .query_one("SELECT total FROM invoices WHERE id = 7", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(total, 120);
    assert_eq!(guarded.fence_of("invoice:7").await, Some(42));
}

/// The `sql` example of `fencelock::guard::sql`'s documentation that begins with `first`.
pub fn documented_example(first: &str) -> String {
    let source = include_str!("../../fencelock/src/guard/sql.rs");
    let docs: Vec<&str> = source
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(|line| line.strip_prefix(' ').unwrap_or(line))
        .collect();
    let start = docs
        .iter()
        .position(|line| *line == first)
        .unwrap_or_else(|| panic!("no example beginning {first:?}"));
    assert_eq!(docs[start - 1], "```sql");
    let end = start + docs[start..].iter().position(|l| *l == "```").unwrap();
    docs[start..end].join("\n")
}

/// The Rust guard for PostgreSQL admits through `fencelock_guard.admit`: it shares the table
/// with callers in other languages, a refusal leaves its transaction usable, and keys
/// installed in the database refuse what a guard without keys let through (`403`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_guard_admits_through_the_sql_function() {
    let mut guarded = Guarded::empty().await;
    guarded
        .session
        .batch_execute(guard::postgres::SCHEMA)
        .await
        .unwrap();
    guarded
        .session
        .batch_execute(guard::postgres::SCHEMA)
        .await
        .unwrap();
    guarded
        .session
        .batch_execute("CREATE TABLE log (fence bigint NOT NULL, outcome text NOT NULL)")
        .await
        .unwrap();
    let registry = Registry::new();
    let rust = Guard::new(FenceKeys::default(), GuardMetrics::register(&registry));
    let checked = |token: &str| rust.check("doc", &FencingToken::new(token)).unwrap();

    // Another language's service admits 5 first.
    assert_eq!(
        admit(&guarded.session, "doc", "5").await,
        Answer::Admitted(5)
    );
    let tx = guarded.session.transaction().await.unwrap();
    let admission = guard::postgres::admit(&tx, &checked("4"), rust.metrics()).await;
    let current = Fence::new(5).unwrap();
    assert_eq!(admission.unwrap(), Admission::Stale { current });
    // The transaction is still usable: the refusal can be recorded.
    tx.execute("INSERT INTO log VALUES (4, 'rejected')", &[])
        .await
        .unwrap();
    let admission = guard::postgres::admit(&tx, &checked("6"), rust.metrics()).await;
    assert_eq!(admission.unwrap(), Admission::Admitted);
    tx.commit().await.unwrap();
    assert_eq!(guarded.rows("log").await, 1);
    assert_eq!(guarded.fence_of("doc").await, Some(6));
    admit(&guarded.session, "doc", "5").await.refused("FL409");

    // Keys installed in the database refuse the bare fence the keyless Rust guard let
    // through, and the Rust guard counts it as an invalid token.
    guarded.key_file("fence.key");
    guarded.apply(&["fence.key"]).await;
    let tx = guarded.session.transaction().await.unwrap();
    let refused = guard::postgres::admit(&tx, &checked("7"), rust.metrics())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, GuardError::InvalidToken(_)),
        "{refused:?}"
    );
    assert_eq!(refused.status().as_u16(), 403);
    drop(tx);
    let counted = |outcome: &str| {
        let text = fencelock::metrics::render(&registry);
        let sample = format!("fencelock_guard_writes_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|line| line.strip_prefix(&sample).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {sample} in {text}"))
    };
    assert_eq!(
        [
            counted("admitted"),
            counted("stale"),
            counted("invalid_token")
        ],
        ["1", "1", "1"]
    );
}

/// A failed `fencelock guard install` says so in one line, naming the database without its
/// password, and its cause once (a pool error's text repeats its cause's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_guard_install_says_its_cause_once() {
    let db = TestDb::new(StoreKind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("{}_missing", db.url());
    let output = process::run(
        dir.path(),
        &["guard", "install", "--database-url", &missing],
    );
    let line =
        fencelock_testkit::assert_failed_in_one_line(&output, "guard install, no such database");
    assert!(
        line.starts_with("fencelock guard: connecting to "),
        "{line}"
    );
    assert!(line.contains("does not exist"), "{line}");
    assert_eq!(line.matches("db error").count(), 1, "{line}");

    let refused = format!(
        "postgres://postgres@127.0.0.1:{}/x",
        fencelock_testkit::closed_port()
    );
    let output = process::run(
        dir.path(),
        &["guard", "install", "--database-url", &refused],
    );
    let line =
        fencelock_testkit::assert_failed_in_one_line(&output, "guard install, nobody listening");
    assert!(line.contains("store unavailable"), "{line}");
    assert_eq!(line.matches("error connecting").count(), 1, "{line}");
}
