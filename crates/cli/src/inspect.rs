//! `ksearch show`, `ksearch export` and `ksearch report`: open a run's store and print or write
//! what `ksearch_search::report` renders of it.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use ksearch_interop::flashinfer;
use ksearch_search::report;
use ksearch_store::RunStore;

use crate::exit;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// List every candidate, not only the last 15.
    #[arg(long)]
    pub all: bool,

    /// Print the run as one JSON document (every candidate, the world model, the time account).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RunsArgs {
    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Lists the runs under --runs-dir: task, status and the confirmed best.
pub fn runs(args: &RunsArgs) -> Result<u8> {
    let rows = report::runs(&args.runs_dir)
        .with_context(|| format!("cannot list {}", args.runs_dir.display()))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", report::render_runs(&rows));
    }
    Ok(exit::OK)
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Directory to write the kernel and its README into; default: `<run dir>/export`.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,

    /// `flashinfer`: a FlashInfer-Bench Solution and Trace lines (tasks imported from it).
    #[arg(long, default_value = "ksearch", value_parser = ["ksearch", "flashinfer"])]
    pub format: String,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run id (or unique prefix) under --runs-dir, or a run directory.
    pub run: String,

    #[arg(long, default_value = "runs", value_name = "DIR")]
    pub runs_dir: PathBuf,

    /// Where to write the page; default: `<run dir>/report.html`.
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,

    /// Open the page in the desktop's browser once written.
    #[arg(long)]
    pub open: bool,

    /// Print what was written as JSON (path, candidates, evaluations, bytes).
    #[arg(long)]
    pub json: bool,
}

/// Writes the run's HTML report and prints its path and size.
pub fn report(args: &ReportArgs) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    let path = args.out.clone().unwrap_or_else(|| store.report_path());
    let page = report::render_html(&store).context("cannot render the report")?;
    std::fs::write(&path, &page.html)
        .with_context(|| format!("cannot write {}", path.display()))?;
    if args.json {
        let doc = serde_json::json!({"report": path, "candidates": page.candidates,
                                     "evaluations": page.evaluations, "bytes": page.html.len()});
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!("{}", written_line(&path, &page));
    }
    if args.open {
        open_in_browser(&path);
    }
    Ok(exit::OK)
}

/// Renders the run's report into `path`; returns a line saying what was written.
pub fn write_report(store: &RunStore, path: &std::path::Path) -> Result<String> {
    let page = report::render_html(store).context("cannot render the report")?;
    std::fs::write(path, &page.html).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(written_line(path, &page))
}

fn written_line(path: &std::path::Path, page: &report::HtmlReport) -> String {
    format!(
        "wrote {} ({} candidates, {} evaluations, {:.0} KiB)",
        path.display(),
        page.candidates,
        page.evaluations,
        page.html.len() as f64 / 1024.0
    )
}

fn open_in_browser(path: &std::path::Path) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    if let Err(e) = std::process::Command::new(opener)
        .arg(path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
    {
        eprintln!(
            "ksearch: cannot open a browser ({opener}: {e}); the report is at {}",
            path.display()
        );
    }
}

pub fn show(args: &ShowArgs) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::show_json(&store)?)?
        );
    } else {
        print!("{}", report::render_show(&store, args.all)?);
    }
    Ok(exit::OK)
}

/// Writes the best kernel and its README (or, `--format flashinfer`, its Solution and Traces)
/// into `--out` and prints the paths written.
pub fn export(args: &ExportArgs) -> Result<u8> {
    let store = RunStore::open_ref(&args.runs_dir, &args.run).context("cannot open the run")?;
    let files = if args.format == "flashinfer" {
        let best = report::best_evaluation(&store)?;
        let when = flashinfer::Provenance {
            run_id: store.id(),
            timestamp: &best.evaluated_at,
        };
        let x = flashinfer::export(best.kernel.task.dir(), &best.source, &best.eval, &when)?;
        vec![
            (format!("{}.json", x.name), x.solution),
            ("traces.jsonl".into(), x.traces),
        ]
    } else {
        let x = report::export(&store)?;
        vec![(x.file, x.source), ("README.md".into(), x.readme)]
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| store.dir().join("export"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    for (name, text) in files {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("{}", path.display());
    }
    Ok(exit::OK)
}
