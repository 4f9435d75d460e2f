//! Where a table's layout is kept: the columns its compacted files are sorted by are a property of the table's
//! Delta metadata (`tables_delta::LAYOUT`, a JSON array), and each file compaction sorted so is named with a tag
//! of those columns (`compacted-<tag>-<uuid>.parquet`), so that the files that follow the layout are known from
//! the log alone. Columns set for the table by its owner are another property (`tables_delta::LAYOUT_PINNED`),
//! which compactions follow in place of the endpoints' choice.

use domain::TableLayout;
use sha2::{Digest, Sha256};
use tables_delta::{DataFile, Snapshot};

/// The columns the table's compacted files are sorted by, as its properties record them.
pub(crate) fn recorded(snapshot: &Snapshot) -> Vec<String> {
    let text = snapshot.properties.get(tables_delta::LAYOUT);
    text.and_then(|text| serde_json::from_str(text).ok()).unwrap_or_else(Vec::new)
}

/// The columns set for the table in place of its endpoints' choice (`tables_delta::LAYOUT_PINNED`), if any.
pub(crate) fn pinned(snapshot: &Snapshot) -> Option<Vec<String>> {
    let text = snapshot.properties.get(tables_delta::LAYOUT_PINNED)?;
    serde_json::from_str(text).ok()
}

/// The value of `tables_delta::LAYOUT_PINNED` for `columns` (an empty list too: the table is not sorted).
pub(crate) fn pin_property(columns: &[String]) -> String {
    serde_json::to_string(columns).expect("a list of strings is JSON")
}

/// The property's value for `columns` (`None`, removing it, for none).
pub(crate) fn property(columns: &[String]) -> Option<String> {
    (!columns.is_empty()).then(|| serde_json::to_string(columns).expect("a list of strings is JSON"))
}

/// The tag naming the files sorted by `columns`: 16 hex digits of a digest of them (`None` for none).
pub(crate) fn tag(columns: &[String]) -> Option<String> {
    let text = property(columns)?;
    Some(hex::encode(&Sha256::digest(text.as_bytes())[..8]))
}

/// The start of the names of files sorted by the columns `tag` stands for.
pub(crate) fn clustered_prefix(compacted: &str, tag: &str) -> String {
    format!("{compacted}{tag}-")
}

/// Whether `file` is one compaction sorted by the columns `tag` stands for.
pub(crate) fn is_clustered(file: &DataFile, compacted: &str, tag: &str) -> bool {
    let prefix = clustered_prefix(compacted, tag);
    file.location.filename().is_some_and(|name| name.starts_with(&prefix))
}

/// The table's layout for its record.
pub(crate) fn of(snapshot: &Snapshot, compacted: &str) -> TableLayout {
    let cluster_by = recorded(snapshot);
    let files_clustered = tag(&cluster_by).map_or(0, |tag| {
        snapshot.files.iter().filter(|file| is_clustered(file, compacted, &tag)).count() as u64
    });
    TableLayout { cluster_by, files_clustered, pinned: pinned(snapshot) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_stands_for_the_columns_in_their_order() {
        let columns = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(tag(&[]), None);
        let tag_ab = tag(&columns(&["a", "b"])).unwrap();
        assert_eq!(tag_ab.len(), 16);
        assert_eq!(tag(&columns(&["a", "b"])).unwrap(), tag_ab);
        assert_ne!(tag(&columns(&["b", "a"])).unwrap(), tag_ab);
        assert_ne!(tag(&columns(&["a"])).unwrap(), tag_ab);
    }
}
