//! Pages of a list: `{"count", "next", "previous", "results"}`, with absolute links to the neighbouring pages
//! that keep the request's other query parameters.

use actix_web::HttpRequest;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::endpoint::{Endpoint, Version};
use super::table::{Table, TableVersion};

/// Declares a page of `$item`s: the same shape for every list, one type (and schema name) each.
macro_rules! page {
    ($(#[$doc:meta])* $name:ident of $item:ty $(, $derive:ident)*) => {
        $(#[$doc])*
        #[derive(Debug, Serialize, ToSchema $(, $derive)*)]
        pub struct $name {
            /// How many items match, on every page.
            pub count: u64,
            /// The next page's URL, or null on the last.
            #[schema(required = true)]
            pub next: Option<String>,
            /// The previous page's URL, or null on the first.
            #[schema(required = true)]
            pub previous: Option<String>,
            pub results: Vec<$item>,
        }

        impl $name {
            pub(crate) fn of<T>(req: &HttpRequest, page: domain::Page<T>) -> Self
            where
                $item: From<T>,
            {
                let (next, previous) = links(req, &page);
                Self { count: page.total, next, previous, results: page.items.into_iter().map(<$item>::from).collect() }
            }
        }
    };
}

page!(
    /// A page of endpoints, ordered by name.
    EndpointPage of Endpoint, Deserialize
);
page!(
    /// A page of an endpoint's versions, newest first.
    VersionPage of Version, Deserialize
);
page!(
    /// A page of a project's tables, ordered by name.
    TablePage of Table, Deserialize
);
page!(
    /// A page of a table's versions (the commits of its Delta log), newest first.
    TableVersionPage of TableVersion, Deserialize
);

fn links<T>(req: &HttpRequest, page: &domain::Page<T>) -> (Option<String>, Option<String>) {
    let limit = u64::from(page.request.limit);
    let offset = page.request.offset;
    let next = page.has_next().then(|| page_url(req, limit, offset + limit));
    let previous = page.has_previous().then(|| page_url(req, limit, offset.saturating_sub(limit)));
    (next, previous)
}

fn page_url(req: &HttpRequest, limit: u64, offset: u64) -> String {
    let query = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(
            form_urlencoded::parse(req.query_string().as_bytes())
                .filter(|(k, _)| k != "limit" && k != "offset"),
        )
        .append_pair("limit", &limit.to_string())
        .append_pair("offset", &offset.to_string())
        .finish();
    let info = req.connection_info();
    format!("{}://{}{}?{}", info.scheme(), info.host(), req.path(), query)
}
