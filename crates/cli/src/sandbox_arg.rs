//! `--sandbox`, shared by the commands that evaluate candidates.

use clap::Args;
use ksearch_eval::SandboxMode;

/// How the process that runs candidate code is confined (docs/security.md).
#[derive(Debug, Clone, Copy, Args)]
pub struct SandboxArg {
    /// Confinement of candidate code: `best-effort` uses every layer this machine allows and
    /// records which; `require` refuses to evaluate without all of them.
    #[arg(
        long = "sandbox",
        value_name = "MODE",
        env = "KSEARCH_SANDBOX",
        default_value = "best-effort",
        value_parser = parse_mode
    )]
    pub mode: SandboxMode,
}

fn parse_mode(s: &str) -> Result<SandboxMode, String> {
    s.parse()
}
