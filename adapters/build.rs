//! Embeds every migration under `schema/postgres/`: a new `NNNN_name.sql` file is part of the
//! binary without being listed anywhere (`src/migrations.rs` includes the generated list).

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../schema/postgres");
    // A directory is watched whole: a file added, changed or removed rebuilds the list.
    println!("cargo:rerun-if-changed={}", folder.display());
    let mut files: Vec<String> = std::fs::read_dir(&folder)
        .unwrap_or_else(|error| panic!("reading {}: {error}", folder.display()))
        .map(|entry| entry.expect("a directory entry").file_name().into_string().expect("UTF-8"))
        .filter(|name| name.ends_with(".sql"))
        .collect();
    files.sort();
    let mut list = String::from("&[\n");
    for file in &files {
        let path = folder.join(file);
        writeln!(list, "    ({file:?}, include_str!({:?})),", path.display().to_string())
            .expect("writing to a string");
    }
    list.push(']');
    let out =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("migrations.rs");
    std::fs::write(&out, list).unwrap_or_else(|error| panic!("writing {}: {error}", out.display()));
}
