//! Embeds the built pages under `assets/` (the dashboard and GraphiQL, built from `web/` by
//! `npm run build` and committed): every file is part of the binary without being listed
//! anywhere (`src/pages.rs` includes the generated table), so `leasehold serve` alone serves
//! them and `cargo build` needs no npm.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    // A directory is watched whole: a file added, changed or removed rebuilds the table.
    println!("cargo:rerun-if-changed={}", root.display());
    let mut files = Vec::new();
    collect(&root, &mut files);
    files.sort();
    let mut table = String::from("&[\n");
    for file in &files {
        let route = file.strip_prefix(&root).expect("under the root");
        let route = route.components().map(|part| part.as_os_str().to_str().expect("UTF-8"));
        let route = format!("/{}", route.collect::<Vec<_>>().join("/"));
        writeln!(table, "    ({route:?}, include_bytes!({:?})),", file.display().to_string())
            .expect("writing to a string");
    }
    table.push(']');
    let out = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("assets.rs");
    std::fs::write(&out, table)
        .unwrap_or_else(|error| panic!("writing {}: {error}", out.display()));
}

/// Every file under `folder` but dotfiles (`.source-hash` is the build's record, not a page).
fn collect(folder: &Path, files: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(folder)
        .unwrap_or_else(|error| panic!("reading {}: {error}", folder.display()));
    for entry in entries {
        let entry = entry.expect("a directory entry");
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            collect(&path, files);
        } else {
            files.push(path);
        }
    }
}
