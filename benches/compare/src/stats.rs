//! Percentiles of latencies and the middle of the rounds.

/// p50 and p99 of latencies given in microseconds, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Percentiles {
    pub p50_ms: f64,
    pub p99_ms: f64,
}

impl Percentiles {
    /// `None` for no samples.
    pub fn of(samples_us: &mut [u32]) -> Option<Self> {
        if samples_us.is_empty() {
            return None;
        }
        samples_us.sort_unstable();
        Some(Self {
            p50_ms: f64::from(nearest_rank(samples_us, 0.50)) / 1000.0,
            p99_ms: f64::from(nearest_rank(samples_us, 0.99)) / 1000.0,
        })
    }
}

/// The nearest-rank percentile `q` (0 < q <= 1) of sorted, non-empty `sorted`.
fn nearest_rank(sorted: &[u32], q: f64) -> u32 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The median of `values` (the mean of the middle two for an even count); `None` when
/// empty.
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

/// The smallest and largest of `values`; `None` when empty.
pub fn range(values: &[f64]) -> Option<(f64, f64)> {
    let min = values.iter().copied().reduce(f64::min)?;
    let max = values.iter().copied().reduce(f64::max)?;
    Some((min, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut samples: Vec<u32> = (1..=100).rev().map(|ms| ms * 1000).collect();
        let p = Percentiles::of(&mut samples).unwrap();
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(Percentiles::of(&mut [7000]).unwrap().p99_ms, 7.0);
        assert!(Percentiles::of(&mut []).is_none());
    }

    #[test]
    fn median_and_range() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(range(&[2.0, 5.0, 1.0]), Some((1.0, 5.0)));
    }
}
