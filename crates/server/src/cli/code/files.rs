//! The folder a team keeps in git: `endpoints/<name>.yaml`, one endpoint per file, and `tests/<name>.yaml`, the
//! cases of an endpoint. YAML is read and written with `serde-saphyr` (pure Rust, maintained, panic-free on any
//! input; `serde_yaml` is archived): files are written deterministically, fields in a fixed order, variables by
//! name, the SQL as a literal block.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use domain::{
    CacheAge, CreateEndpoint, EndpointName, Freshness, Hibernation, Invalid, Query, QueryKind, SyncFrequency,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use http_actix::api::Endpoint;

/// The folder of endpoint files under the directory.
pub const ENDPOINTS: &str = "endpoints";
/// The folder of test files under the directory.
pub const TESTS: &str = "tests";

/// One endpoint as its file holds it. A field left out takes the server's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointFile {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub query: Sql,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variables: BTreeMap<String, VariableFile>,
    /// Seconds a run's result is served from the cache; left out for the server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_age_seconds: Option<u32>,
    #[serde(default = "active")]
    pub is_active: bool,
    #[serde(default)]
    pub is_materialized: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_frequency: Option<String>,
    /// Left out for the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freshness_seconds: Option<u32>,
    /// Left out for the default (7 days); `null` never hibernates.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    pub hibernate_after_days: Option<Option<u32>>,
}

fn active() -> bool {
    true
}

/// A field that is present, `null` included (`Some(None)`); serde's default tells a field left out (`None`).
fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(de: D) -> Result<Option<T>, D::Error> {
    T::deserialize(de).map(Some)
}

/// SQL, written as a literal block (`|`) so that it reads as it was typed, line for line.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct Sql(pub String);

impl Serialize for Sql {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serde_saphyr::LitStr(&self.0).serialize(serializer)
    }
}

/// A declared variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariableFile {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
    /// Written only when it is not what the default says (required without one, optional with one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

impl From<&Endpoint> for EndpointFile {
    fn from(remote: &Endpoint) -> Self {
        let variables = remote
            .query
            .variables
            .iter()
            .map(|(name, v)| {
                let variable = VariableFile {
                    kind: v.variable_type.to_string(),
                    default: v.default.clone(),
                    required: (v.required != v.default.is_none()).then_some(v.required),
                    description: v.description.clone(),
                };
                (name.clone(), variable)
            })
            .collect();
        Self {
            name: remote.name.clone(),
            description: remote.description.clone(),
            query: Sql(remote.query.query.clone()),
            variables,
            cache_age_seconds: remote.cache_age_seconds,
            is_active: remote.is_active,
            is_materialized: remote.is_materialized,
            sync_frequency: remote.sync_frequency.as_deref().map(str::to_owned),
            freshness_seconds: (remote.freshness_seconds != Freshness::DEFAULT_SECONDS)
                .then_some(remote.freshness_seconds),
            hibernate_after_days: (remote.hibernate_after_days != Hibernation::DEFAULT.days())
                .then_some(remote.hibernate_after_days),
        }
    }
}

impl EndpointFile {
    /// The endpoint the file says, as the API reads a create: the domain's own command, checked by its rules
    /// (names, variable declarations, settings) before anything is sent.
    ///
    /// # Errors
    /// The first field the rules refuse, named as the API names it.
    pub fn command(&self) -> Result<CreateEndpoint, Invalid> {
        let variables = serde_json::to_value(&self.variables)
            .map_err(|err| Invalid::field("variables", err.to_string()))?;
        let query = Query::try_from(
            &json!({"kind": QueryKind::Sql.as_str(), "query": self.query.0, "variables": variables}),
        )?;
        Ok(CreateEndpoint {
            description: Some(self.description.clone()),
            is_active: Some(self.is_active),
            is_materialized: Some(self.is_materialized),
            cache_age: Some(CacheAge::new(self.cache_age_seconds.map(i64::from))?),
            sync_frequency: self.sync_frequency.as_deref().map(SyncFrequency::parse).transpose()?,
            freshness: Some(Freshness::new(self.freshness_seconds.map(i64::from))?),
            hibernation: self
                .hibernate_after_days
                .map(|days| Hibernation::new(days.map(i64::from)))
                .transpose()?,
            ..CreateEndpoint::new(EndpointName::parse(&self.name)?, query)
        })
    }

    /// The body of a create or an update that makes the endpoint what the file says, every field given (a
    /// field the file leaves out is sent as the server's default, not left as it was).
    ///
    /// # Errors
    /// As [`EndpointFile::command`].
    pub fn body(&self) -> Result<Value, Invalid> {
        self.command().map(|command| command.to_body())
    }

    /// The file's text.
    ///
    /// # Errors
    /// A value YAML cannot hold (none that the server answers).
    pub fn to_yaml(&self) -> Result<String, FileError> {
        serde_saphyr::to_string(self).map_err(|err| FileError::Write(err.to_string()))
    }
}

/// A file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("could not write YAML: {0}")]
    Write(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io { path: path.to_owned(), source }
}

/// The `.yaml` files of `folder` by the name before `.yaml` (none when the folder does not exist), each
/// name an endpoint name.
fn yaml_files(folder: &Path) -> Result<BTreeMap<String, PathBuf>, FileError> {
    let mut files = BTreeMap::new();
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(err) => return Err(io(folder)(err)),
    };
    for entry in entries {
        let path = entry.map_err(io(folder))?.path();
        let Some(stem) = path.extension().filter(|ext| *ext == "yaml").and(path.file_stem()) else {
            continue;
        };
        let stem = stem.to_string_lossy().into_owned();
        if !EndpointName::is_valid(&stem) {
            let reason = "the file name is not an endpoint name (letters, digits, '-' and '_')".into();
            return Err(FileError::Invalid { path, reason });
        }
        files.insert(stem, path);
    }
    Ok(files)
}

fn read_text(path: &Path) -> Result<String, FileError> {
    std::fs::read_to_string(path).map_err(io(path))
}

/// Every endpoint file of `dir`, by name; a file whose `name` is not its file's name is refused.
///
/// # Errors
/// A file that cannot be read, is not valid YAML of the format, or names another endpoint.
pub fn read_endpoints(dir: &Path) -> Result<BTreeMap<String, EndpointFile>, FileError> {
    let mut endpoints = BTreeMap::new();
    for (stem, path) in yaml_files(&dir.join(ENDPOINTS))? {
        let file: EndpointFile = serde_saphyr::from_str(&read_text(&path)?)
            .map_err(|err| FileError::Invalid { path: path.clone(), reason: err.to_string() })?;
        if file.name != stem {
            let reason = format!("name: {} is not the file's name ({stem}.yaml)", file.name);
            return Err(FileError::Invalid { path, reason });
        }
        endpoints.insert(stem, file);
    }
    Ok(endpoints)
}

/// Writes `file` as `dir/endpoints/<name>.yaml` whole (a reader never sees half a file); says whether its
/// bytes changed.
///
/// # Errors
/// A name that is not an endpoint name (never a path out of the folder), or the file system's failure.
pub fn write_endpoint(dir: &Path, file: &EndpointFile) -> Result<bool, FileError> {
    let folder = dir.join(ENDPOINTS);
    let path = folder.join(format!("{}.yaml", file.name));
    if !EndpointName::is_valid(&file.name) {
        return Err(FileError::Invalid {
            path,
            reason: "the server named an endpoint unlike any name".into(),
        });
    }
    let text = file.to_yaml()?;
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    std::fs::create_dir_all(&folder).map_err(io(&folder))?;
    let staged = tempfile::NamedTempFile::new_in(&folder).map_err(io(&folder))?;
    std::fs::write(staged.path(), text).map_err(io(staged.path()))?;
    staged.persist(&path).map_err(|err| io(&path)(err.error))?;
    Ok(true)
}

/// One case of an endpoint's tests: a run with `variables`, and what its answer must be.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub name: String,
    #[serde(default)]
    pub variables: serde_json::Map<String, Value>,
    pub expect: Expectation,
}

/// What a run must answer: any of its row count, its columns in order, its rows in order (each value of the
/// same type: `1` is not `1.0`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    pub row_count: Option<usize>,
    pub columns: Option<Vec<String>>,
    pub rows: Option<Vec<serde_json::Map<String, Value>>>,
}

/// Every test file of `dir`: the cases of each endpoint, by its name.
///
/// # Errors
/// A file that cannot be read or is not a list of cases, or a case that expects nothing.
pub fn read_tests(dir: &Path) -> Result<BTreeMap<String, Vec<TestCase>>, FileError> {
    let mut tests = BTreeMap::new();
    for (endpoint, path) in yaml_files(&dir.join(TESTS))? {
        let cases: Vec<TestCase> = serde_saphyr::from_str(&read_text(&path)?)
            .map_err(|err| FileError::Invalid { path: path.clone(), reason: err.to_string() })?;
        if let Some(case) = cases.iter().find(|case| {
            let expect = &case.expect;
            expect.row_count.is_none() && expect.columns.is_none() && expect.rows.is_none()
        }) {
            let reason = format!("case {:?} expects nothing (give row_count, columns or rows)", case.name);
            return Err(FileError::Invalid { path, reason });
        }
        tests.insert(endpoint, cases);
    }
    Ok(tests)
}
