//! The key-value form of a PostgreSQL connection string (libpq's "conninfo"):
//! `host=a,b port=5432,5433 user=app password='s e c' dbname=locks target_session_attrs=read-write`.
//!
//! The driver parses this form itself; this module only reads it far enough to take out the
//! TLS parameters the server handles on its own (`sslmode`, `sslrootcert`) and to write it
//! for logs with the password masked.

use anyhow::bail;

/// Whether `text` is a key-value connection string rather than a URL: it starts with a
/// `key=`, and has no `://`.
pub(crate) fn is_key_value(text: &str) -> bool {
    let text = text.trim_start();
    let key_len = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    key_len > 0 && text[key_len..].trim_start().starts_with('=') && !text.contains("://")
}

/// One `key=value` pair: the key, the value as written (quotes and escapes included), and
/// the value it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pair {
    pub key: String,
    pub raw: String,
    pub value: String,
}

impl Pair {
    pub(crate) fn written(&self) -> String {
        format!("{}={}", self.key, self.raw)
    }
}

/// Splits a key-value connection string into its pairs, following libpq's rules: spaces
/// around `=` are allowed; a value is either a run of non-space characters or a
/// single-quoted string, in both of which `\` escapes the next character.
pub(crate) fn parse(text: &str) -> anyhow::Result<Vec<Pair>> {
    let mut pairs = Vec::new();
    let mut chars = text.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(key_start, _)) = chars.peek() else {
            return Ok(pairs);
        };
        let mut key_end = key_start;
        while let Some((i, c)) = chars.next_if(|(_, c)| *c != '=' && !c.is_whitespace()) {
            key_end = i + c.len_utf8();
        }
        let key = &text[key_start..key_end];
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if chars.next_if(|(_, c)| *c == '=').is_none() || key.is_empty() {
            bail!("DATABASE_URL: expected key=value in the connection string, near {key:?}");
        }
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let raw_start = chars.peek().map_or(text.len(), |&(i, _)| i);
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let mut closed = !quoted;
        while let Some(&(_, c)) = chars.peek() {
            if !quoted && c.is_whitespace() {
                break;
            }
            chars.next();
            match c {
                '\\' => match chars.next() {
                    Some((_, escaped)) => value.push(escaped),
                    None => bail!("DATABASE_URL: a connection string ends in a lone backslash"),
                },
                '\'' if quoted => {
                    closed = true;
                    break;
                }
                c => value.push(c),
            }
        }
        if !closed {
            bail!("DATABASE_URL: unterminated quoted value for {key:?}");
        }
        let raw_end = chars.peek().map_or(text.len(), |&(i, _)| i);
        pairs.push(Pair {
            key: key.to_owned(),
            raw: text[raw_start..raw_end].to_owned(),
            value,
        });
    }
}

/// `pairs` written back, the password's value masked.
pub(crate) fn redacted(pairs: &[Pair]) -> String {
    pairs
        .iter()
        .map(|p| {
            if p.key == "password" {
                "password=***".to_owned()
            } else {
                p.written()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(text: &str) -> Vec<(String, String)> {
        parse(text)
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect()
    }

    fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_key_value_form_is_told_from_a_url() {
        assert!(is_key_value("host=a,b port=5432"));
        assert!(is_key_value("  dbname = x"));
        assert!(!is_key_value("postgres://u@h/db?sslmode=require"));
        assert!(!is_key_value("sqlite://x=y"));
        assert!(!is_key_value("mysql://x"));
        assert!(!is_key_value("=x"));
        assert!(!is_key_value("fencelock.db"));
    }

    #[test]
    fn pairs_follow_libpq_quoting() {
        assert_eq!(
            values("host=a,b  port = 5432,5433 user=postgres dbname=x"),
            kv(&[
                ("host", "a,b"),
                ("port", "5432,5433"),
                ("user", "postgres"),
                ("dbname", "x")
            ])
        );
        assert_eq!(
            values(r"password='it\'s a secret' options='-c a=b' x=a\ b empty=''"),
            kv(&[
                ("password", "it's a secret"),
                ("options", "-c a=b"),
                ("x", "a b"),
                ("empty", "")
            ])
        );
        assert!(parse("host").is_err());
        assert!(parse("=x").is_err());
        assert!(parse("password='open").is_err());
        assert!(parse(r"password=x\").is_err());
    }

    #[test]
    fn the_password_is_masked_whatever_its_quoting() {
        let text = r"host=db user=app password='s3 cr\'et' dbname=locks";
        let shown = redacted(&parse(text).unwrap());
        assert_eq!(shown, "host=db user=app password=*** dbname=locks");
        assert!(!shown.contains("s3"));
        assert_eq!(
            redacted(&parse("host=db password=plain").unwrap()),
            "host=db password=***"
        );
    }
}
