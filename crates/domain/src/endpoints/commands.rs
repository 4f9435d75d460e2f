//! What a caller asks of the endpoint rules, as typed values: a create, a partial update, a version number.
//! The JSON bodies of the interface become these through `TryFrom<&Value>`, which names the field of every
//! wrong type or unknown key; the rules that relate fields to each other and to the stored endpoint are the
//! service's.

use serde_json::Value;

use super::model::EndpointName;
use super::settings::{CacheAge, Freshness, Hibernation, SyncFrequency};
use crate::error::Invalid;
use crate::fields::Fields;
use crate::query::Query;

/// The fields a create or update body may carry.
pub const ENDPOINT_FIELDS: [&str; 10] = [
    "name",
    "description",
    "query",
    "derived_from_insight",
    "is_active",
    "is_materialized",
    "cache_age_seconds",
    "sync_frequency",
    "freshness_seconds",
    "hibernate_after_days",
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
/// the default cache age, freshness and hibernation, and the default sync frequency once materialized.
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
    /// `Some(Hibernation::NEVER)` (an explicit null) never hibernates.
    pub hibernation: Option<Hibernation>,
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
            hibernation: None,
        }
    }

    /// Whether the endpoint is active: `true` unless the caller said otherwise.
    pub fn active(&self) -> bool {
        self.is_active.unwrap_or(true)
    }

    /// Whether the endpoint is materialized: `false` unless the caller said otherwise.
    pub fn materialized(&self) -> bool {
        self.is_materialized.unwrap_or(false)
    }

    /// The body that creates this endpoint, which read back is this command (see [`TryFrom<&Value>`]); sent as an
    /// update, it makes an existing endpoint exactly this: every field is written, a default as the null that
    /// asks for it (or, for a flag, its default value).
    pub fn to_body(&self) -> Value {
        let or_null = |value: Option<Value>| value.unwrap_or(Value::Null);
        let mut body = serde_json::Map::new();
        body.insert("name".into(), self.name.as_str().into());
        body.insert("description".into(), or_null(self.description.clone().map(Value::from)));
        body.insert("query".into(), self.query.to_json());
        body.insert(
            "derived_from_insight".into(),
            or_null(self.derived_from_insight.clone().map(Value::from)),
        );
        body.insert("is_active".into(), self.active().into());
        body.insert("is_materialized".into(), self.materialized().into());
        body.insert(
            "cache_age_seconds".into(),
            or_null(self.cache_age.and_then(CacheAge::configured).map(Value::from)),
        );
        body.insert("sync_frequency".into(), or_null(self.sync_frequency.map(|f| f.as_str().into())));
        body.insert(
            "freshness_seconds".into(),
            or_null(self.freshness.and_then(Freshness::configured).map(Value::from)),
        );
        body.insert(
            "hibernate_after_days".into(),
            or_null(self.hibernation.unwrap_or(Hibernation::DEFAULT).days().map(Value::from)),
        );
        debug_assert!(body.keys().all(|key| ENDPOINT_FIELDS.contains(&key.as_str())));
        Value::Object(body)
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
            hibernation: hibernation_field(&fields)?,
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
    /// `Some(Hibernation::NEVER)` (an explicit null) never hibernates.
    pub hibernation: Option<Hibernation>,
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
            hibernation: hibernation_field(&fields)?,
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

fn hibernation_field(fields: &Fields<'_>) -> Result<Option<Hibernation>, Invalid> {
    fields.nullable_int("hibernate_after_days")?.map(Hibernation::new).transpose()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// What a client writes with `to_body` the API reads back as the same command, every field given.
    #[test]
    fn a_create_body_reads_back_as_its_command() {
        let query = Query::try_from(&json!({
            "kind": "SQLQuery",
            "query": "SELECT {variables.n} AS n",
            "variables": {"n": {"type": "Integer", "default": 3, "description": "how many"}},
        }))
        .unwrap();
        let name = EndpointName::parse("counted").unwrap();
        let defaults = CreateEndpoint::new(name.clone(), query.clone());
        let set = CreateEndpoint {
            description: Some("d".into()),
            derived_from_insight: Some("i".into()),
            is_active: Some(false),
            is_materialized: Some(true),
            cache_age: Some(CacheAge::new(Some(60)).unwrap()),
            sync_frequency: Some(SyncFrequency::parse("1hour").unwrap()),
            freshness: Some(Freshness::new(Some(5)).unwrap()),
            hibernation: Some(Hibernation::NEVER),
            ..defaults.clone()
        };
        assert_eq!(CreateEndpoint::try_from(&set.to_body()).unwrap(), set);
        let read = CreateEndpoint::try_from(&defaults.to_body()).unwrap();
        assert_eq!((read.active(), read.materialized()), (true, false));
        assert_eq!(
            read,
            CreateEndpoint {
                is_active: Some(true),
                is_materialized: Some(false),
                cache_age: Some(CacheAge::DEFAULT),
                freshness: Some(Freshness::DEFAULT),
                hibernation: Some(Hibernation::DEFAULT),
                ..defaults
            }
        );
        // As an update, the same body sets every field.
        let patch = EndpointPatch::try_from(&set.to_body()).unwrap();
        assert_eq!(
            (patch.description, patch.is_active, patch.freshness, patch.hibernation),
            (Some(Some("d".into())), Some(false), set.freshness, Some(Hibernation::NEVER))
        );
    }

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
        let never = EndpointPatch::try_from(&json!({"hibernate_after_days": null})).unwrap();
        assert_eq!(never.hibernation, Some(Hibernation::NEVER));
        for days in [json!(0), json!(3651), json!(1.5), json!("7")] {
            let err = EndpointPatch::try_from(&json!({"hibernate_after_days": days})).unwrap_err();
            assert_eq!(err.attr.as_deref(), Some("hibernate_after_days"), "{days}");
        }
    }
}
