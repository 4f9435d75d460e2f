//! Arrow types as clients see them.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use domain::{Column, ColumnType};

pub(crate) fn column_type(data_type: &DataType) -> ColumnType {
    match data_type {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => ColumnType::Integer,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => ColumnType::Float,
        DataType::Decimal32(..)
        | DataType::Decimal64(..)
        | DataType::Decimal128(..)
        | DataType::Decimal256(..) => ColumnType::Decimal,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
        DataType::Boolean => ColumnType::Boolean,
        DataType::Date32 | DataType::Date64 => ColumnType::Date,
        DataType::Timestamp(..) => ColumnType::Datetime,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::ListView(_) => {
            ColumnType::Array
        }
        DataType::Struct(_) | DataType::Map(..) => ColumnType::Json,
        DataType::Dictionary(_, value) => column_type(value),
        _ => ColumnType::Unknown,
    }
}

pub(crate) fn columns(schema: &Schema) -> Vec<Column> {
    schema
        .fields()
        .iter()
        .map(|f| Column { name: f.name().clone(), column_type: column_type(f.data_type()) })
        .collect()
}

/// The batch with each column cast to the type `schema` gives it.
pub(crate) fn cast_to(
    batch: &RecordBatch,
    schema: &SchemaRef,
) -> Result<RecordBatch, datafusion::arrow::error::ArrowError> {
    let columns = batch
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(column, field)| datafusion::arrow::compute::cast(column, field.data_type()))
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(Arc::clone(schema), columns)
}
