//! Schemas of the domain's named values (sync frequencies, refresh modes, statuses, types) and patterns, built
//! from the domain's own lists so that each is written once.

use domain::{
    ColumnType, EndpointName, Fold, MaterializationStatus, QueryKind, Refresh, ResultFormat, SyncFrequency,
    TableName, TableSource, VariableType,
};
use serde_json::Value;
use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
use utoipa::openapi::Object;

/// A string that is one of `names`; with `nullable`, null too.
fn one_of(names: impl IntoIterator<Item = Value>, nullable: bool) -> Object {
    let mut values: Vec<Value> = names.into_iter().collect();
    let schema_type = if nullable {
        values.push(Value::Null);
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::new(Type::String)
    };
    ObjectBuilder::new().schema_type(schema_type).enum_values(Some(values)).build()
}

fn names(names: impl IntoIterator<Item = &'static str>) -> impl Iterator<Item = Value> {
    names.into_iter().map(Value::from)
}

pub(crate) fn nullable_sync_frequency() -> Object {
    one_of(names(SyncFrequency::ALL.map(SyncFrequency::as_str)), true)
}

pub(crate) fn refresh() -> Object {
    one_of(names(Refresh::ALL.map(Refresh::as_str)), false)
}

/// A body may send `"refresh": null` for the default.
pub(crate) fn nullable_refresh() -> Object {
    one_of(names(Refresh::ALL.map(Refresh::as_str)), true)
}

pub(crate) fn materialization_status() -> Object {
    one_of(names(MaterializationStatus::ALL.map(MaterializationStatus::as_str)), false)
}

/// Null until a stored result of the version says.
pub(crate) fn nullable_fold() -> Object {
    one_of(names(Fold::NAMES), true)
}

pub(crate) fn query_kind() -> Object {
    one_of(names(QueryKind::ALL.map(QueryKind::as_str)), false)
}

pub(crate) fn variable_type() -> Object {
    one_of(names(VariableType::ALL.map(VariableType::as_str)), false)
}

/// Column types are written as the domain serializes them.
pub(crate) fn column_type() -> Object {
    one_of(ColumnType::ALL.iter().filter_map(|t| serde_json::to_value(t).ok()), false)
}

pub(crate) fn nullable_column_type() -> Object {
    one_of(ColumnType::ALL.iter().filter_map(|t| serde_json::to_value(t).ok()), true)
}

pub(crate) fn column_change() -> Object {
    one_of(names(domain::ColumnChange::ALL.map(domain::ColumnChange::as_str)), false)
}

/// A body may send `"format": null` for JSON or what `Accept` asks for.
/// A run's documented format: JSON (the others are exports').
pub(crate) fn nullable_json_format() -> Object {
    one_of(names([ResultFormat::Json.as_str()]), true)
}

/// The formats of an export: every one but JSON.
pub(crate) fn export_format() -> Object {
    let exported = ResultFormat::ALL.into_iter().filter(|format| *format != ResultFormat::Json);
    one_of(names(exported.map(ResultFormat::as_str)), false)
}

pub(crate) fn result_format() -> Object {
    one_of(names(ResultFormat::ALL.map(ResultFormat::as_str)), false)
}

/// The formats of external files, and `delta` for a Delta table.
pub(crate) fn file_format() -> Object {
    one_of(names(domain::ExternalSource::FORMATS), false)
}

pub(crate) fn table_format() -> Object {
    one_of(names(TableSource::FORMATS), false)
}

/// A table's name.
pub(crate) fn table_name() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(TableName::PATTERN))
}

/// An endpoint's name.
pub(crate) fn endpoint_name() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(Type::String).pattern(Some(EndpointName::PATTERN))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn names_are_the_domains_own() {
        let frequencies = serde_json::to_value(super::nullable_sync_frequency()).unwrap();
        assert_eq!(
            frequencies["enum"],
            json!(["5min", "30min", "1hour", "6hour", "12hour", "24hour", "7day", "30day", null])
        );
        let columns = serde_json::to_value(super::column_type()).unwrap();
        assert_eq!(columns["enum"][5], "date");
        assert_eq!(columns["enum"].as_array().unwrap().len(), domain::ColumnType::ALL.len());
    }
}
