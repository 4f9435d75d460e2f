//! Logging: readable lines in development, JSON lines in production, always on stderr so command output on
//! stdout stays machine-readable.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `RUST_LOG` overrides the default level (`info`).
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal: a log file or collector gets plain text, and formatting is cheaper.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    // A second initialisation (tests building several applications) is harmless, so its error is ignored.
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}
