//! Logging: readable lines in development, JSON lines in production, always on stderr so command output on
//! stdout stays machine-readable.

use std::fmt;

use tracing::field::Field;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::{debug_fn, Writer};
use tracing_subscriber::EnvFilter;

/// Fields written as plain `name=value`. The default formatter styles every name for a terminal even when
/// colours are off, and every request's span formats its fields, so this is measurably cheaper on the hot path.
fn plain_field(writer: &mut Writer<'_>, field: &Field, value: &dyn fmt::Debug) -> fmt::Result {
    if field.name() == "message" {
        write!(writer, "{value:?}")
    } else {
        write!(writer, "{}={value:?}", field.name())
    }
}

/// Installs the global subscriber. `RUST_LOG` overrides the default level (`info`).
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file or collector gets plain text, and formatting is cheaper.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second initialisation (tests building several applications) is harmless, so its error is ignored.
    let _ = if json {
        builder.json().try_init()
    } else if ansi {
        builder.try_init()
    } else {
        builder.fmt_fields(debug_fn(plain_field).delimited(" ")).try_init()
    };
}
