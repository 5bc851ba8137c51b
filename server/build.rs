//! The release binary embeds the built site (target/site). cargo-leptos builds the site before the server in
//! release (with --precompress), and this makes cargo rebuild the server when the site changed, so the binary never
//! embeds a stale or missing site. Debug builds read the site from disk at run time and need no rebuild.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rerun-if-changed=../target/site");
    }
}
