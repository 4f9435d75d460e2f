//! What a caller asks of the endpoint rules, as typed values: a create, a partial update, a version number.
//! The JSON bodies of the interface become these through `TryFrom<&Value>`, which names the field of every
//! wrong type or unknown key; the rules that relate fields to each other and to the stored endpoint are the
//! service's.

use serde_json::Value;

use super::model::EndpointName;
use super::settings::{CacheAge, Freshness, SyncFrequency};
use crate::error::Invalid;
use crate::fields::Fields;
use crate::query::Query;

/// The fields a create or update body may carry.
pub const ENDPOINT_FIELDS: [&str; 9] = [
    "name",
    "description",
    "query",
    "derived_from_insight",
    "is_active",
    "is_materialized",
    "cache_age_seconds",
    "sync_frequency",
    "freshness_seconds",
];

/// The update field that confirms a change breaking the callers of an endpoint that ran recently.
pub const CONFIRM_BREAKING: &str = "confirm_breaking";

/// The fields an update body may carry: those of a create, and [`CONFIRM_BREAKING`].
const UPDATE_FIELDS: [&str; ENDPOINT_FIELDS.len() + 1] = {
    let mut fields = [CONFIRM_BREAKING; ENDPOINT_FIELDS.len() + 1];
    let mut i = 0;
    while i < ENDPOINT_FIELDS.len() {
        fields[i] = ENDPOINT_FIELDS[i];
        i += 1;
    }
    fields
};

/// A new endpoint as a caller describes it. `None` takes the default: no description, active, not materialized,
/// the default cache age and freshness, and the default sync frequency once materialized.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateEndpoint {
    pub name: EndpointName,
    pub query: Query,
    pub description: Option<String>,
    pub derived_from_insight: Option<String>,
    pub is_active: Option<bool>,
    pub is_materialized: Option<bool>,
    pub cache_age: Option<CacheAge>,
    pub sync_frequency: Option<SyncFrequency>,
    pub freshness: Option<Freshness>,
}

impl CreateEndpoint {
    /// An endpoint with this name and query, every setting at its default.
    pub fn new(name: EndpointName, query: Query) -> Self {
        Self {
            name,
            query,
            description: None,
            derived_from_insight: None,
            is_active: None,
            is_materialized: None,
            cache_age: None,
            sync_frequency: None,
            freshness: None,
        }
    }
}

/// Reads a create body (the interface's `EndpointRequest`).
impl TryFrom<&Value> for CreateEndpoint {
    type Error = Invalid;

    fn try_from(body: &Value) -> Result<Self, Invalid> {
        let fields = Fields::new(body, &ENDPOINT_FIELDS)?;
        let name = match fields.nullable_string("name")? {
            Some(Some(name)) => EndpointName::parse(&name)?,
            _ => return Err(Invalid::required("name")),
        };
        let query = match fields.get("query") {
            None | Some(Value::Null) => return Err(Invalid::required("query")),
            Some(raw) => Query::try_from(raw)?,
        };
        Ok(Self {
            name,
            query,
            is_materialized: fields.bool("is_materialized")?,
            sync_frequency: sync_frequency_field(&fields)?.flatten(),
            description: fields.nullable_string("description")?.flatten(),
            derived_from_insight: fields.nullable_string("derived_from_insight")?.flatten(),
            is_active: fields.bool("is_active")?,
            cache_age: cache_age_field(&fields)?,
            freshness: freshness_field(&fields)?,
        })
    }
}

/// A partial update. `None` leaves a field as it is; for the nullable fields `Some(None)` is an explicit null.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointPatch {
    /// A name sent with an update; anything but the endpoint's own is a rename, which is refused.
    pub name: Option<Option<String>>,
    /// `Some(None)` clears the description.
    pub description: Option<Option<String>>,
    pub derived_from_insight: Option<Option<String>>,
    pub is_active: Option<bool>,
    pub is_materialized: Option<bool>,
    pub cache_age: Option<CacheAge>,
    /// `Some(None)` asks for the default frequency of a materialized endpoint.
    pub sync_frequency: Option<Option<SyncFrequency>>,
    /// `Some(Freshness::DEFAULT)` (an explicit null) goes back to the default.
    pub freshness: Option<Freshness>,
    /// A query to save; it makes a new version only when its canonical form differs from the current one.
    pub query: Option<Query>,
    /// Saves a new version that breaks the callers of an endpoint that ran recently.
    pub confirm_breaking: bool,
}

/// Reads an update body (the interface's `EndpointRequest`, every field optional, and [`CONFIRM_BREAKING`]).
impl TryFrom<&Value> for EndpointPatch {
    type Error = Invalid;

    fn try_from(body: &Value) -> Result<Self, Invalid> {
        let fields = Fields::new(body, &UPDATE_FIELDS)?;
        let query = match fields.get("query") {
            None => None,
            Some(Value::Null) => return Err(Invalid::field("query", "query cannot be null.")),
            Some(raw) => Some(Query::try_from(raw)?),
        };
        Ok(Self {
            confirm_breaking: fields.bool(CONFIRM_BREAKING)?.unwrap_or(false),
            name: fields.nullable_string("name")?,
            description: fields.nullable_string("description")?,
            derived_from_insight: fields.nullable_string("derived_from_insight")?,
            is_active: fields.bool("is_active")?,
            is_materialized: fields.bool("is_materialized")?,
            cache_age: cache_age_field(&fields)?,
            sync_frequency: sync_frequency_field(&fields)?,
            freshness: freshness_field(&fields)?,
            query,
        })
    }
}

fn sync_frequency_field(fields: &Fields<'_>) -> Result<Option<Option<SyncFrequency>>, Invalid> {
    fields
        .nullable_string("sync_frequency")?
        .map(|raw| raw.as_deref().map(SyncFrequency::parse).transpose())
        .transpose()
}

fn cache_age_field(fields: &Fields<'_>) -> Result<Option<CacheAge>, Invalid> {
    fields.nullable_int("cache_age_seconds")?.map(CacheAge::new).transpose()
}

fn freshness_field(fields: &Fields<'_>) -> Result<Option<Freshness>, Invalid> {
    fields.nullable_int("freshness_seconds")?.map(Freshness::new).transpose()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_patch_says_which_fields_it_sets_and_which_it_clears() {
        let patch = EndpointPatch::try_from(&json!({"description": null, "is_active": false})).unwrap();
        assert_eq!(patch.description, Some(None));
        assert_eq!(patch.is_active, Some(false));
        assert_eq!((patch.query, patch.name, patch.confirm_breaking), (None, None, false));
        let err = EndpointPatch::try_from(&json!({"query": null})).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("query"));
        let err = EndpointPatch::try_from(&json!({"rename": "x"})).unwrap_err();
        assert_eq!(err.attr.as_deref(), Some("rename"));
    }
}
