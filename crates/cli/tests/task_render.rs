//! `ksearch tasks --render`: the wiring of ksearch_knowledge::render (its unit tests cover the
//! modes in detail) on a built-in family: a source from --set, the family's error with exit
//! status 2, the listing of a variants file and a batch read from stdin.

mod common;
use common::{ksearch, workspace_root};
use predicates::prelude::*;
use serde_json::Value;

#[test]
fn a_setting_renders_and_a_bad_one_gets_the_family_error() {
    ksearch()
        .args(["tasks", "--render", "selective-scan", "--backend", "cuda"])
        .args([
            "--set",
            "algo=chunked",
            "--set",
            "items=8",
            "--set",
            "exp2=true",
        ])
        .assert()
        .code(0)
        .stdout(predicate::str::contains("ex2.approx"))
        .stdout(predicate::str::contains("extern \"C\""));
    ksearch()
        .args(["tasks", "--render", "selective-scan", "--backend", "cuda"])
        .args(["--set", "threads=100"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(
            "`threads` = 100 is outside its domain",
        ));
}

#[test]
fn variants_and_batches_come_back_as_json_lines() {
    let variants = workspace_root().join("gpu/mamba/variants.toml");
    let out = ksearch()
        .args([
            "tasks",
            "--render",
            "selective-scan",
            "--backend",
            "mlx",
            "--list",
        ])
        .arg(&variants)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["name"], "s0_sequential");
    assert_eq!(lines[0]["knobs"]["algo"], "sequential");
    let out = ksearch()
        .args([
            "tasks",
            "--render",
            "selective-scan",
            "--backend",
            "mlx",
            "--batch",
        ])
        .write_stdin(
            "{\"name\": \"x\", \"knobs\": {\"algo\": \"chunked\"}}\n{\"knobs\": {\"vec\": 3}}\n",
        )
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let replies: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), 2, "{text}");
    assert_eq!(replies[0]["name"], "x");
    assert!(replies[0]["source"]
        .as_str()
        .unwrap()
        .contains("def selective_scan("));
    assert!(replies[1]["error"]
        .as_str()
        .unwrap()
        .contains("outside its domain"));
}
