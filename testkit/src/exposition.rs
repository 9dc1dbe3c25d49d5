//! Reading a `GET /metrics` answer: the Prometheus text exposition format parsed into
//! samples, so that tests look a sample up by its name and labels instead of searching text.

use std::collections::BTreeMap;

/// The content type of the Prometheus text format.
pub const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of one exposition.
#[derive(Debug, Clone)]
pub struct Exposition {
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// Parses the text format; panics, naming the line, on anything else.
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| sample(line).unwrap_or_else(|| panic!("not a sample line: {line:?}")))
            .collect();
        Self { samples }
    }

    /// The value of the sample named `name` whose labels are exactly `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }

    /// Like [`Exposition::get`], failing the test when there is no such sample.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in {:#?}", self.samples))
    }

    /// The samples named `name`, whatever their labels.
    pub fn family(&self, name: &str) -> Vec<&Sample> {
        self.samples.iter().filter(|s| s.name == name).collect()
    }

    /// Every label value of every sample.
    pub fn label_values(&self) -> impl Iterator<Item = &str> {
        self.samples
            .iter()
            .flat_map(|s| s.labels.values().map(String::as_str))
    }
}

fn sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = label_set(inner)?;
        labels = parsed;
        rest = after;
    }
    // A timestamp may follow the value; fencelock writes none, but the format allows it.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// `k="v",k2="v2"}` and what follows the closing brace; values may hold `\"`, `\\`, `\n`.
fn label_set(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start_matches([',', ' ']);
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_key) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after_key.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        text = &after_key[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_found_by_name_and_exact_labels() {
        let text = "# HELP a_total x\n# TYPE a_total counter\n\
            a_total{outcome=\"held\"} 3\n\
            a_total{outcome=\"odd \\\"one\\\", \\\\ here\",kind=\"k\"} 1\n\
            b_bucket{le=\"+Inf\"} 2\nc 7.5\n";
        let exposition = Exposition::parse(text);
        assert_eq!(exposition.get("a_total", &[("outcome", "held")]), Some(3.0));
        assert_eq!(exposition.get("a_total", &[]), None);
        assert_eq!(
            exposition.get(
                "a_total",
                &[("outcome", "odd \"one\", \\ here"), ("kind", "k")]
            ),
            Some(1.0)
        );
        assert_eq!(exposition.value("b_bucket", &[("le", "+Inf")]), 2.0);
        assert_eq!(exposition.value("c", &[]), 7.5);
        assert_eq!(exposition.family("a_total").len(), 2);
    }
}
