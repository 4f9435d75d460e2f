//! Human durations for `--expires-in`: `90d`, `12h`, `30m`, `45s`.

use std::time::Duration;

pub(crate) fn parse(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let number: u64 =
        number.parse().map_err(|_| format!("'{raw}' is not a duration such as 90d, 12h, 30m or 45s"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("'{raw}' has an unknown unit; use s, m, h or d")),
    };
    if number == 0 {
        return Err("the duration must be positive".into());
    }
    number.checked_mul(seconds).map(Duration::from_secs).ok_or_else(|| format!("'{raw}' is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("90d").unwrap(), Duration::from_secs(90 * 86_400));
        assert_eq!(parse("12h").unwrap(), Duration::from_secs(43_200));
        assert_eq!(parse("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse("45s").unwrap(), Duration::from_secs(45));
        for bad in ["", "d", "10", "10w", "0d", "-1d", "99999999999999999999d"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
