//! Logging: readable lines in development, JSON lines in production, always on stderr so command output on
//! stdout stays machine-readable.
//!
//! A line written while serving a request names it: `request{method=.. path=.. request_id=..}` in text, and
//! top-level `request_id`, `method` and `path` keys in JSON. The request is a task-local of the HTTP adapter
//! ([`RequestContext`]), not a span, so serving a request formats nothing unless something is logged.

use std::fmt;

use http_actix::RequestContext;
use tracing::field::Field;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{debug_fn, Format, Json, JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;

/// Fields written as plain `name=value`. The default formatter styles every name for a terminal even when
/// colours are off, which costs more for nothing.
fn plain_field(writer: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    if field.name() == "message" {
        write!(writer, "{value:?}")
    } else {
        write!(writer, "{}={value:?}", field.name())
    }
}

/// Text lines: `TIME LEVEL request{..}:span{..}: target: message fields`, the default layout with the request
/// first among the spans.
struct Text;

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut writer)?;
        let level = *event.metadata().level();
        if writer.has_ansi_escapes() {
            let colour = match level {
                Level::ERROR => 31,
                Level::WARN => 33,
                Level::INFO => 32,
                Level::DEBUG => 34,
                Level::TRACE => 35,
            };
            write!(writer, " \x1b[{colour}m{level:>5}\x1b[0m ")?;
        } else {
            write!(writer, " {level:>5} ")?;
        }
        let mut spans = false;
        if let Some(written) = RequestContext::current(|request| {
            write!(
                writer,
                "request{{method={} path={} request_id={}}}:",
                request.method(),
                request.path(),
                request.id()
            )
        }) {
            written?;
            spans = true;
        }
        for span in ctx.event_scope().into_iter().flat_map(tracing_subscriber::registry::Scope::from_root) {
            writer.write_str(span.name())?;
            if let Some(fields) = span.extensions().get::<FormattedFields<N>>().filter(|f| !f.is_empty()) {
                write!(writer, "{{{fields}}}")?;
            }
            writer.write_char(':')?;
            spans = true;
        }
        if spans {
            writer.write_char(' ')?;
        }
        write!(writer, "{}: ", event.metadata().target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// JSON lines: tracing-subscriber's layout, with the request's keys first in the object.
struct JsonLines(Format<Json>);

impl<S> FormatEvent<S, JsonFields> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some(request) = RequestContext::current(request_keys) else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        // The inner line is one object, `{"timestamp":..}`: the request's keys go right after its brace.
        let rest = line.strip_prefix('{').ok_or(fmt::Error)?;
        write!(writer, "{{{request},{rest}")
    }
}

/// `"request_id":..,"method":..,"path":..` with JSON escapes.
fn request_keys(request: &RequestContext) -> String {
    let string = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "\"request_id\":{},\"method\":{},\"path\":{}",
        string(request.id()),
        string(request.method()),
        string(request.path())
    )
}

/// What is logged unless `RUST_LOG` says otherwise: `info`, but the MCP SDK's protocol chatter (a line per
/// message it serves) only from `warn`, so a flood of MCP requests does not grow the log by a line each, and
/// the Delta kernel's (deltalake's `buoyant_kernel`: a line of several kilobytes, the whole log segment, each
/// time a table's snapshot is built or checkpointed) only from `warn` too.
pub const DEFAULT_FILTER: &str = "info,rmcp=warn,buoyant_kernel=warn";

/// Installs the global subscriber. `RUST_LOG` overrides [`DEFAULT_FILTER`].
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    // Colours only for a person at a terminal: a log file or collector gets plain text, and formatting is cheaper.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A second initialisation (tests building several applications) is harmless, so its error is ignored.
    let _ = subscriber(json, ansi, filter, std::io::stderr).try_init();
}

/// The subscriber `init` installs, writing to `writer`: JSON lines or text (with colours when `ansi`).
pub fn subscriber<W>(
    json: bool,
    ansi: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    if json {
        Box::new(builder.json().event_format(JsonLines(tracing_subscriber::fmt::format().json())).finish())
    } else if ansi {
        Box::new(builder.event_format(Text).finish())
    } else {
        Box::new(builder.event_format(Text).fmt_fields(debug_fn(plain_field).delimited(" ")).finish())
    }
}
