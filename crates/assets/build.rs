//! `include_dir!` does not tell cargo which files it read (that needs a nightly API), so an edit
//! to a task, a knowledge pack or the harness would leave a stale copy in the binary. Cargo
//! checks a directory named here recursively for changed files.

fn main() {
    for dir in ["../../tasks", "../../knowledge", "../../harness"] {
        println!("cargo:rerun-if-changed={dir}");
    }
}
