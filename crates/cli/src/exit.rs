//! Exit codes shared by all commands.

/// Everything passed.
pub const OK: u8 = 0;
/// At least one candidate was rejected (or, for `doctor`, something required is missing).
pub const REJECTED: u8 = 1;
/// Usage or set-up error: nothing (more) could be evaluated.
pub const SETUP: u8 = 2;
/// A run stopped because its proposer's calls kept failing; it is saved and resumable.
pub const GAVE_UP: u8 = 3;
/// A run stopped by Ctrl-C or SIGTERM (128 + SIGINT, as shells report it); it is saved
/// and resumable.
pub const INTERRUPTED: u8 = 130;
