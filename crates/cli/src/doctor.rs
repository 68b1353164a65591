//! `ksearch doctor`: what this machine offers for evaluation, and how to get what is missing.
//! What is checked and how the harness's probe is summarised is `ksearch_eval::doctor`.

use crate::exit;
use anyhow::Result;
use clap::Args;
use ksearch_eval::doctor::Diagnosis;
use ksearch_eval::{harness_env, SandboxMode};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,

    /// Set up the evaluation environment and print only its Python interpreter (for scripts).
    #[arg(long, conflicts_with = "json")]
    python_path: bool,

    /// With `require`, a sandbox layer this machine lacks fails the check.
    #[command(flatten)]
    sandbox: crate::sandbox_arg::SandboxArg,
}

pub fn run(args: &DoctorArgs) -> Result<u8> {
    if args.python_path {
        let env = harness_env::resolve()?;
        println!("{}", env.python.display());
        return Ok(exit::OK);
    }
    let diagnosis = Diagnosis::examine(args.sandbox.mode == SandboxMode::Require);
    let healthy = diagnosis.healthy();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&diagnosis.to_json())?);
    } else {
        print!("{}\n{}\n", diagnosis.render(), diagnosis.verdict());
    }
    Ok(if healthy { exit::OK } else { exit::REJECTED })
}
