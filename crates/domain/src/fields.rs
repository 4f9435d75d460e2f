//! Typed reading of a JSON request body, with an error naming the field for every wrong type or unknown key.

use serde_json::{Map, Value};

use crate::error::Invalid;

/// A JSON object whose keys were checked against an allow-list.
pub struct Fields<'a> {
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    /// # Errors
    /// [`Invalid`] when the body is not an object or has a key outside `allowed`.
    pub fn new(body: &'a Value, allowed: &[&str]) -> Result<Self, Invalid> {
        let obj = body.as_object().ok_or_else(|| Invalid::whole("The body must be a JSON object."))?;
        if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(Invalid::field(
                key.as_str(),
                format!("Unknown field '{key}'. Allowed fields: {}.", allowed.join(", ")),
            ));
        }
        Ok(Self { obj })
    }

    /// The raw value, `None` when absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key)
    }

    pub fn contains(&self, key: &str) -> bool {
        self.obj.contains_key(key)
    }

    /// Absent: `None`; null: `Some(None)`; a string: `Some(Some(s))`.
    ///
    /// # Errors
    /// [`Invalid`] when the value is neither null nor a string.
    pub fn nullable_string(&self, key: &str) -> Result<Option<Option<String>>, Invalid> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(Value::String(s)) => Ok(Some(Some(s.clone()))),
            Some(_) => Err(Invalid::field(key, format!("{key} must be a string."))),
        }
    }

    /// Absent or null: `None`.
    ///
    /// # Errors
    /// [`Invalid`] when the value is not a boolean.
    pub fn bool(&self, key: &str) -> Result<Option<bool>, Invalid> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(Invalid::field(key, format!("{key} must be true or false."))),
        }
    }

    /// Absent: `None`; null: `Some(None)`; an integer: `Some(Some(n))`.
    ///
    /// # Errors
    /// [`Invalid`] when the value is not an integer that fits in 64 bits.
    pub fn nullable_int(&self, key: &str) -> Result<Option<Option<i64>>, Invalid> {
        match self.obj.get(key) {
            None => Ok(None),
            Some(Value::Null) => Ok(Some(None)),
            Some(v) => integer(v)
                .map(|n| Some(Some(n)))
                .ok_or_else(|| Invalid::field(key, format!("{key} must be an integer."))),
        }
    }
}

/// A JSON number as a 64-bit integer, with JSON Schema's meaning of `integer`: a number without a fractional
/// part, so `3600.0` is `3600` (clients and generators that hold every number as a float send that form).
/// `None` for a fraction, a non-number, or a number outside 64 bits.
pub fn integer(value: &Value) -> Option<i64> {
    // 2^63 is exact as an f64; every integral f64 in [-2^63, 2^63) converts without loss.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    value.as_i64().or_else(|| {
        #[expect(clippy::cast_possible_truncation, reason = "integral and in range, checked first: exact")]
        value.as_f64().filter(|f| f.fract() == 0.0 && (-LIMIT..LIMIT).contains(f)).map(|f| f as i64)
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::integer;

    #[test]
    fn integers_are_numbers_without_a_fraction() {
        assert_eq!(integer(&json!(3600)), Some(3600));
        assert_eq!(integer(&json!(3600.0)), Some(3600));
        assert_eq!(integer(&json!(-37419.0)), Some(-37419));
        assert_eq!(integer(&json!(i64::MIN)), Some(i64::MIN));
        assert_eq!(integer(&json!(-(2f64.powi(63)))), Some(i64::MIN));
        for not_one in [
            json!(1.5),
            json!(2f64.powi(63)),
            json!(1e300),
            json!(u64::MAX),
            json!("1"),
            json!(null),
            json!(true),
        ] {
            assert_eq!(integer(&not_one), None, "{not_one}");
        }
    }
}
