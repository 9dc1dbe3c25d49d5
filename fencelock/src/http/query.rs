//! Query strings (`name=value&...`, form-encoded): each parameter one the route knows, given
//! at most once, so that a typo such as `limt=5` never passes as the default.

use actix_web::web;

use super::FieldError;

/// The values of a query's known parameters, in the order the route named them (`None`:
/// absent), and an error for every other parameter and every one given twice.
#[derive(Debug)]
pub struct Params<const N: usize> {
    pub values: [Option<String>; N],
    pub errors: Vec<FieldError>,
}

/// Splits `query` into the values of `names`. A parameter not among them is an error with
/// the message `unknown`, a second value of one with `repeated` (each service words these its
/// own way). A query that cannot be decoded at all is one error, on the field `query`.
pub fn params<const N: usize>(
    query: &str,
    names: [&str; N],
    unknown: &str,
    repeated: &str,
) -> Result<Params<N>, FieldError> {
    let pairs = web::Query::<Vec<(String, String)>>::from_query(query)
        .map_err(|e| FieldError::new("query", e))?
        .into_inner();
    let mut values = [const { None }; N];
    let mut errors = Vec::new();
    for (name, value) in pairs {
        match names.iter().position(|known| *known == name) {
            None => errors.push(FieldError::new(name, unknown)),
            Some(i) if values[i].is_some() => errors.push(FieldError::new(name, repeated)),
            Some(i) => values[i] = Some(value),
        }
    }
    Ok(Params { values, errors })
}

/// A plain decimal integer: ASCII digits only (no sign, point or exponent), any number of
/// them; `None` when it is not one or does not fit.
pub fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(query: &str) -> Params<2> {
        params(query, ["a", "b"], "unknown", "twice").unwrap()
    }

    fn named(params: &Params<2>) -> Vec<(&str, &str)> {
        let errors = params.errors.iter();
        errors
            .map(|e| (e.field.as_str(), e.message.as_str()))
            .collect()
    }

    #[test]
    fn known_parameters_are_found_by_name_in_any_order() {
        let found = split("b=2&a=%2B1");
        assert_eq!(found.values, [Some("+1".to_owned()), Some("2".to_owned())]);
        assert!(found.errors.is_empty());
        assert_eq!(split("").values, [None, None]);
    }

    #[test]
    fn unknown_and_repeated_parameters_are_named_in_order() {
        let found = split("c=1&a=1&a=2&b");
        assert_eq!(found.values, [Some("1".to_owned()), Some(String::new())]);
        assert_eq!(named(&found), [("c", "unknown"), ("a", "twice")]);
    }

    #[test]
    fn decimals_are_digits_only() {
        assert_eq!(decimal("0100"), Some(100));
        for bad in [
            "",
            "-1",
            "+1",
            "1.5",
            "1e2",
            " 5",
            "99999999999999999999999",
        ] {
            assert_eq!(decimal(bad), None, "{bad:?}");
        }
    }
}
