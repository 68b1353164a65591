//! Renders one kernel of a task's template family:
//! `cargo run -p ksearch-knowledge --example render -- tasks/softmax algorithm=online lanes=16`.
//! Values parse as bool, then integer, then string. `--list` prints the knobs instead;
//! `--emit DIR` writes every valid combination to `DIR/<n>.c` plus a `manifest.json` that
//! `tests/check_kernels.py` and `tools/bench_family.py` read.

use ksearch_knowledge::{KnobValue, Knobs, TemplateFamily};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task_dir) = args.first() else {
        eprintln!("usage: render <task-dir> [--list | knob=value ...]");
        return ExitCode::from(2);
    };
    let family = match TemplateFamily::load(std::path::Path::new(task_dir)) {
        Ok(Some(f)) => f,
        Ok(None) => {
            eprintln!("{task_dir} has no templates/");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if args.get(1).map(String::as_str) == Some("--list") {
        for k in family.knobs() {
            let values: Vec<String> = k.values().iter().map(|v| v.to_string()).collect();
            println!(
                "{} [{}] default {}: {}",
                k.name(),
                values.join(", "),
                k.default_value(),
                k.description()
            );
        }
        println!(
            "{} valid of {} combinations",
            family.enumerate().len(),
            family.space_size()
        );
        return ExitCode::SUCCESS;
    }
    if args.get(1).map(String::as_str) == Some("--emit") {
        let Some(dir) = args.get(2) else {
            eprintln!("usage: render <task-dir> --emit DIR");
            return ExitCode::from(2);
        };
        return match emit(&family, std::path::Path::new(dir)) {
            Ok(n) => {
                println!("wrote {n} kernels to {dir}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut knobs = Knobs::new();
    for arg in &args[1..] {
        let Some((k, v)) = arg.split_once('=') else {
            eprintln!("expected knob=value, got {arg:?}");
            return ExitCode::from(2);
        };
        let value = if let Ok(b) = v.parse::<bool>() {
            KnobValue::Bool(b)
        } else if let Ok(i) = v.parse::<i64>() {
            KnobValue::Int(i)
        } else {
            KnobValue::Str(v.to_string())
        };
        knobs.insert(k.to_string(), value);
    }
    match family.render(&knobs) {
        Ok(src) => {
            print!("{src}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn emit(
    family: &TemplateFamily,
    dir: &std::path::Path,
) -> Result<usize, Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir)?;
    let mut kernels = Vec::new();
    for (i, knobs) in family.enumerate().iter().enumerate() {
        let path = dir.join(format!("{i}.c"));
        std::fs::write(&path, family.render(knobs)?)?;
        kernels.push(serde_json::json!({
            "task": family.name(),
            "source": path.canonicalize()?,
            "label": ksearch_knowledge::format_knobs(knobs),
            "knobs": knobs,
        }));
    }
    let manifest = serde_json::json!({"cc": "cc", "jobs": 2, "kernels": kernels});
    std::fs::write(
        dir.join("manifest.json"),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    Ok(kernels.len())
}
