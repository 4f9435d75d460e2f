//! The engine's error messages in the terms of the query its author wrote.
//!
//! DataFusion's messages sometimes print an expression as Rust debug output
//! (`Cast(Cast { expr: Placeholder(Placeholder { id: "$1", .. }), .. })`), name the numbered parameters a
//! query's variables are compiled to (`CAST($1 AS Int64)`), and ask for a bug report on DataFusion's tracker.
//! None of that means anything to the author of the query, and the first shows the engine's plan: here it
//! becomes `{variables.NAME}` or "an expression", and the request for a report goes.

/// DataFusion's request for a bug report, which follows some internal errors.
const BUG_REPORT: &str = "This issue was likely caused by a bug in DataFusion's code";

/// `text` without debug-printed expressions or DataFusion's request for a bug report. A debug-printed expression
/// that is one parameter becomes that parameter (`$1`), which [`name_variables`] names.
pub(crate) fn readable(text: &str) -> String {
    let mut text = text.to_owned();
    if let Some(start) = text.find(BUG_REPORT) {
        let end = text[start..].find("/issues").map_or(text.len(), |i| start + i + "/issues".len());
        let end = if text[end..].starts_with('.') { end + 1 } else { end };
        text.replace_range(start..end, "");
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(start) = debug_expression(rest) {
        out.push_str(&rest[..start]);
        let length = balanced(&rest[start..]);
        out.push_str(&summary(&rest[start..start + length]));
        rest = &rest[start + length..];
    }
    out.push_str(rest);
    out.trim_end().to_owned()
}

/// Where the next debug-printed expression starts: a name written twice, `Name(Name {`.
fn debug_expression(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    text.match_indices('(').find_map(|(open, _)| {
        let start = text[..open].rfind(|c: char| !c.is_ascii_alphanumeric()).map_or(0, |i| i + 1);
        let name = &text[start..open];
        let starts_upper = bytes.get(start).is_some_and(u8::is_ascii_uppercase);
        (starts_upper && text[open + 1..].starts_with(&format!("{name} {{"))).then_some(start)
    })
}

/// The length of the expression at the start of `text`, through the bracket that closes its first one.
fn balanced(text: &str) -> usize {
    let (mut depth, mut quoted, mut escaped) = (0_usize, false, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '(' | '[' | '{' if !quoted => depth += 1,
            ')' | ']' | '}' if !quoted => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    text.len()
}

/// A debug-printed expression said briefly: the one parameter it is about, or "an expression".
fn summary(expression: &str) -> String {
    let mut ids = expression.match_indices("id: \"$").map(|(i, found)| {
        let digits = &expression[i + found.len()..];
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        digits[..end].to_owned()
    });
    match (ids.next(), ids.next()) {
        (Some(id), None) if !id.is_empty() => format!("${id}"),
        _ => "an expression".to_owned(),
    }
}

/// `text` with each parameter (`$1`, and `CAST($1 AS type)` as the compiled query writes it) named by the
/// variable it stands for: `{variables.NAME}`.
pub(crate) fn name_variables(text: &str, names: &[String]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        let digits = &rest[at + 1..];
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        let name = digits[..end].parse::<usize>().ok().and_then(|n| names.get(n.wrapping_sub(1)));
        let Some(name) = name else {
            out.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
            continue;
        };
        let variable = format!("{{variables.{name}}}");
        // `CAST($1 AS Int64)`: the cast is the compiler's, not the author's.
        let before = &rest[..at];
        let after = &digits[end..];
        match (before.strip_suffix("CAST("), after.find(')')) {
            (Some(head), Some(close)) if after.starts_with(" AS ") => {
                out.push_str(head);
                out.push_str(&variable);
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str(before);
                out.push_str(&variable);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_printed_expressions_become_the_variables_they_are() {
        let raw = "Error during planning: Argument #2 must be an INTEGER or NULL, got Cast(Cast { expr: \
                   Placeholder(Placeholder { id: \"$1\", field: None }), field: Field { name: \"\", data_type: \
                   Int64, nullable: true } })";
        let names = ["n".to_owned()];
        assert_eq!(
            name_variables(&readable(raw), &names),
            "Error during planning: Argument #2 must be an INTEGER or NULL, got {variables.n}"
        );
        let two = "got BinaryExpr(BinaryExpr { left: Placeholder(Placeholder { id: \"$1\" }), right: \
                   Placeholder(Placeholder { id: \"$2\" }) }) here";
        assert_eq!(readable(two), "got an expression here");
        let predicate =
            "Cannot create filter with non-boolean predicate 'CAST($2 AS Utf8View)' returning Utf8View";
        assert_eq!(
            name_variables(predicate, &["a".into(), "b".into()]),
            "Cannot create filter with non-boolean predicate '{variables.b}' returning Utf8View"
        );
        assert_eq!(name_variables("costs $5 and $x", &["a".into()]), "costs $5 and $x");
        let report =
            "Function failed. This issue was likely caused by a bug in DataFusion's code. Please help \
                      us to resolve this by filing a bug report in our issue tracker: \
                      https://github.com/apache/datafusion/issues. No function matches.";
        assert_eq!(readable(report), "Function failed.  No function matches.");
    }
}
