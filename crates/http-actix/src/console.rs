//! The web console (the repository's `console/` folder): its built files, embedded in the binary at compile time
//! and served under `/console`. The console is a client of the public API like any other; nothing here knows
//! what it does. A release build carries the files; a debug build reads them from `console/dist` at run time.

use std::borrow::Cow;

use actix_web::http::header::{self, CacheControl, CacheDirective, ContentType, EntityTag, IfNoneMatch};
use actix_web::{HttpMessage, HttpRequest, HttpResponse, HttpResponseBuilder};
use bytes::Bytes;
use rust_embed::Embed;

use crate::error::ApiError;

/// Built by `make console` (Vite, from TypeScript and Svelte). A binary built before it answers 404 that says so.
#[derive(Embed)]
#[folder = "../../console/dist/"]
#[allow_missing = true]
struct Files;

/// Where the console's pages are; `/` leads there.
pub(crate) const HOME: &str = "/console/";
/// Files named by a hash of their content: a new build makes new names, so they may be cached for good.
const HASHED: &str = "assets/";
const PAGE: &str = "index.html";
const A_YEAR: u32 = 365 * 24 * 3600;

/// The console's page loads scripts, styles, images and fonts from this server only, calls only its API, and
/// runs nothing inline; it cannot be framed, and its forms post nowhere.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the console.
pub(crate) async fn home() -> HttpResponse {
    HttpResponse::Found().insert_header((header::LOCATION, HOME)).finish()
}

/// `GET /console/{path}`: a hashed file, or the console's page for any other path (its client-side routes).
pub(crate) async fn serve(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    // The route's tail, empty for the console's root.
    let path = req.match_info().get("path").unwrap_or("");
    let hashed = path.starts_with(HASHED);
    let name = if hashed { path } else { PAGE };
    let Some(file) = Files::get(name) else {
        return Err(if hashed {
            ApiError::RouteNotFound
        } else {
            ApiError::Domain(domain::Error::NotFound(
                "This server was built without its web console; `make build` builds it in.".into(),
            ))
        });
    };
    let etag = EntityTag::new_strong(hex::encode(file.metadata.sha256_hash()));
    let cache = if hashed {
        CacheControl(vec![
            CacheDirective::Public,
            CacheDirective::MaxAge(A_YEAR),
            CacheDirective::Extension("immutable".into(), None),
        ])
    } else {
        // The page names the current files: a browser asks again each time, and gets 304 when it has it.
        CacheControl(vec![CacheDirective::NoCache])
    };
    let unchanged = match req.get_header::<IfNoneMatch>() {
        Some(IfNoneMatch::Any) => true,
        Some(IfNoneMatch::Items(tags)) => tags.iter().any(|tag| tag.weak_eq(&etag)),
        None => false,
    };
    let mut response = if unchanged { HttpResponse::NotModified() } else { HttpResponse::Ok() };
    guarded(&mut response).insert_header(header::ETag(etag)).insert_header(cache);
    if unchanged {
        return Ok(response.finish());
    }
    let body = match file.data {
        Cow::Borrowed(bytes) => Bytes::from_static(bytes),
        Cow::Owned(bytes) => Bytes::from(bytes),
    };
    Ok(response.insert_header(content_type(name, file.metadata.mimetype())).body(body))
}

/// The headers every answer of the console carries.
fn guarded(response: &mut HttpResponseBuilder) -> &mut HttpResponseBuilder {
    response
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
}

/// The file's type by its extension (JavaScript as RFC 9239 names it), with the character set of text.
fn content_type(name: &str, guessed: &str) -> ContentType {
    let mime = if name.ends_with(".js") { "text/javascript" } else { guessed };
    let full = if mime.starts_with("text/") { format!("{mime}; charset=utf-8") } else { mime.to_owned() };
    full.parse().map(ContentType).unwrap_or_else(|_| ContentType::octet_stream())
}
