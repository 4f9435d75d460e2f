//! The web console's files are embedded from `console/dist` (see `src/console.rs`). Cargo learns of a file the
//! embedding read, but not of the folder appearing or its files being replaced by a new build: this makes it
//! compile the crate again when they are.
fn main() {
    println!("cargo:rerun-if-changed=../../console/dist");
}
