//! `ksearch bench mamba` (docs/mamba.md): the options; checking them, running
//! gpu/mamba/bench.py and rendering its report are `ksearch_eval::mamba_bench`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use ksearch_eval::mamba_bench::{self, MambaBench, MambaOptions};
use ksearch_search::report;
use ksearch_store::RunStore;

use crate::bench::BenchArgs;
use crate::exit;

/// The TASK argument of `ksearch bench` that selects the whole-model Mamba bench.
pub const TASK: &str = "mamba";

/// Options of `ksearch bench mamba` (the rest of `ksearch bench`'s: --kernel, --run,
/// --runs-dir, --timeout, --json).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Whole model (TASK = mamba)")]
pub struct MambaArgs {
    /// mamba: a local mamba-*-hf directory; default: random weights (docs/mamba.md).
    #[arg(long, value_name = "DIR")]
    pub weights: Option<PathBuf>,

    /// mamba: prompt lengths for prefill tokens/s.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "512,1024,2048,4096",
        value_name = "L,.."
    )]
    pub lengths: Vec<u32>,

    /// mamba: tokens decoded (after a warm-up) for decode tokens/s.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub decode_tokens: u32,

    /// mamba: implementations to measure.
    #[arg(long, value_delimiter = ',', default_value = "ksearch,mlx-lm,mambapy",
          value_parser = ["ksearch", "mlx-lm", "mambapy"])]
    pub impls: Vec<String>,

    /// mamba: a named setting of gpu/mamba/variants.toml as our scan (default: tuned here).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["kernel", "run"])]
    pub variant: Option<String>,

    /// mamba: also time the scan alone, per layer, against its memory floor.
    #[arg(long)]
    pub kernel_only: bool,

    /// mamba: skip a stock mlx-lm length whose estimated time exceeds this many seconds.
    #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
    pub stock_budget: f64,

    /// mamba: how the MLX decode loops wait: pipelined (as mlx_lm.generate) or sync.
    #[arg(long, default_value = "pipelined", value_parser = ["pipelined", "sync"])]
    pub decode_loop: String,

    /// mamba: also keep the JSON report at this path (the table still goes to stdout).
    #[arg(long, value_name = "FILE")]
    pub save: Option<PathBuf>,

    /// mamba: MLX's launch settings for the bench: MLX's `defaults`, or `auto`: the cheapest
    /// that gpu/mamba/mlx_env_probe.py measures (docs/mamba.md).
    #[arg(long, default_value = "defaults", value_parser = ["defaults", "auto"])]
    pub mlx_settings: String,
}

impl MambaArgs {
    /// The bench's options, with `kernel` as our scan.
    fn options(&self, kernel: Option<PathBuf>) -> MambaOptions {
        MambaOptions {
            weights: self.weights.clone(),
            lengths: self.lengths.clone(),
            decode_tokens: self.decode_tokens,
            impls: self.impls.clone(),
            variant: self.variant.clone(),
            kernel,
            kernel_only: self.kernel_only,
            stock_budget: self.stock_budget,
            decode_loop: self.decode_loop.clone(),
        }
    }
}

/// `ksearch bench mamba ...`; `args` are `ksearch bench`'s with TASK = mamba.
pub fn run(args: &BenchArgs, m: &MambaArgs, quiet: bool) -> Result<u8> {
    if !args.shapes.is_empty() || args.backend.is_some() || args.hardware.is_some() {
        bail!("`ksearch bench mamba` takes neither --shapes, --backend nor --hardware (it runs the whole model on MLX)");
    }
    let timeout = Duration::from_secs_f64(args.timeout);
    let kernel = match (&args.kernel, &args.run) {
        (Some(k), _) => Some(k.clone()),
        (None, Some(run)) => {
            let best = report::best_kernel(
                &RunStore::open_ref(&args.runs_dir, run).context("cannot open the run")?,
            )?;
            mamba_bench::check_run_kernel(run, best.task.kind(), &best.backend)?;
            Some(best.path)
        }
        (None, None) => None,
    };
    let options = m.options(kernel);
    options.check()?;
    let python = ksearch_eval::harness_env::resolve_for(Some("mlx"))
        .context("cannot set up the Python environment (try `ksearch doctor`)")?
        .python;
    let bench = MambaBench::locate(python)?;
    if !quiet {
        let (impls, python) = (m.impls.join(", "), bench.python().display());
        eprintln!("ksearch: bench mamba ({impls}) with {python}");
    }
    let pick = match m.mlx_settings.as_str() {
        "auto" => Some(bench.probe_mlx_settings(timeout, !quiet)?),
        _ => None,
    };
    if let Some(pick) = pick.as_ref().filter(|_| !quiet) {
        eprintln!("ksearch: MLX settings for the bench: {}", pick.describe());
    }
    let run = bench.run(&options, pick.as_ref(), timeout, !quiet)?;
    if let Some(path) = &m.save {
        std::fs::write(path, &run.text)
            .with_context(|| format!("cannot write the report to {}", path.display()))?;
    }
    if args.json {
        let value: serde_json::Value = serde_json::from_str(&run.text)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", mamba_bench::render(&run.report));
    }
    let passed = run.passed()?;
    Ok(if passed { exit::OK } else { exit::REJECTED })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options as parsed by `ksearch bench`, TASK and all.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
        #[command(flatten)]
        mamba: MambaArgs,
    }

    #[test]
    fn the_options_become_the_benchs() {
        use clap::Parser;
        let cli = Cli::parse_from([
            "ksearch",
            "mamba",
            "--lengths",
            "512,4096",
            "--impls",
            "ksearch,mlx-lm",
            "--variant",
            "s3_items",
            "--kernel-only",
            "--decode-tokens",
            "32",
            "--stock-budget",
            "15",
            "--decode-loop",
            "sync",
        ]);
        assert_eq!(cli.bench.task, TASK);
        // What bench.py makes of them is ksearch_eval::mamba_bench's test.
        let expected = MambaOptions {
            weights: None,
            lengths: vec![512, 4096],
            decode_tokens: 32,
            impls: vec!["ksearch".into(), "mlx-lm".into()],
            variant: Some("s3_items".into()),
            kernel: Some("k.py".into()),
            kernel_only: true,
            stock_budget: 15.0,
            decode_loop: "sync".into(),
        };
        assert_eq!(cli.mamba.options(Some("k.py".into())), expected);
        // --variant names a family setting; it cannot be combined with a kernel.
        assert!(
            Cli::try_parse_from(["ksearch", "mamba", "--variant", "x", "--kernel", "k.py"])
                .is_err()
        );
        assert!(Cli::try_parse_from(["ksearch", "mamba", "--impls", "torch"]).is_err());
        assert!(Cli::try_parse_from(["ksearch", "mamba", "--decode-loop", "async"]).is_err());
    }
}
