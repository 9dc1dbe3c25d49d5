//! The migrations are embedded at compile time (`refinery::embed_migrations!`), which tracks
//! the files it read but not the directory: a new migration would not rebuild the crate.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
