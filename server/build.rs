//! The release binary embeds the built site (target/site). `scripts/site.sh` (what `make run`, `make site`,
//! `make bench` and `make test` use) builds the site before the server in release (with --precompress), and this
//! makes cargo rebuild the server when the site changed, so the binary never embeds a stale or missing site. Cargo
//! decides by modification times: cargo-leptos writes every file again, so that script gives the files whose
//! contents and the folders whose names are the same their old times back. Debug builds read the site from disk at
//! run time and need no rebuild.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rerun-if-changed=../target/site");
    }
}
