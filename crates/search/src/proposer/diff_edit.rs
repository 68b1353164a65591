//! SEARCH/REPLACE diff edits: read them out of a model's reply and apply them to a parent
//! kernel.
//!
//! An evolve-style strategy may ask the model to change a parent kernel with blocks like
//!
//! ```text
//! <<<<<<< SEARCH
//! exact lines from the parent
//! =======
//! replacement lines
//! >>>>>>> REPLACE
//! ```
//!
//! instead of rewriting it in full. The reply is untrusted text: blocks may sit inside or
//! outside markdown fences with prose around them, marker lines may have 5 to 9 marker
//! characters, trailing whitespace and a `SEARCH`/`REPLACE` word in any case. Nothing here
//! panics on a reply; every failure is a [`DiffError`] whose message is a sentence the model
//! can act on (blocks are numbered from 1), meant to be sent back to it.
//!
//! Blocks apply in order, each to the source as changed by the blocks before it. A SEARCH
//! part matches a contiguous run of whole source lines: exactly, else ignoring trailing
//! whitespace, else ignoring indentation (then the replacement is re-indented by the same
//! amount); see [`apply_blocks`].

use std::collections::HashMap;

/// One SEARCH/REPLACE block of a reply.
///
/// `search` and `replace` hold their lines, each followed by `\n` (so an empty part is `""`
/// and a part of one blank line is `"\n"`). [`apply_blocks`] also accepts texts without the
/// final newline and with CRLF line ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditBlock {
    pub search: String,
    pub replace: String,
    /// 1-based line of the block's SEARCH marker in the reply.
    pub line: usize,
}

/// How a block's SEARCH text was found in the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchKind {
    /// Line for line as written.
    Exact,
    /// Equal once trailing whitespace is dropped from every line.
    TrailingWhitespace,
    /// Equal once leading and trailing whitespace is dropped from every line; the
    /// replacement was re-indented to the source's indentation.
    Indentation,
}

/// The source after all blocks were applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub source: String,
    /// Number of blocks applied.
    pub blocks: usize,
    /// How each block matched, in block order (for notes and logs).
    pub matches: Vec<MatchKind>,
}

/// Why a reply's blocks could not be read or applied. The `Display` text is addressed to the
/// model that wrote the reply.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum DiffError {
    #[error(
        "the reply has no SEARCH/REPLACE block; write each change as a `<<<<<<< SEARCH` line, \
         the exact lines to change, a `=======` line, the new lines and a `>>>>>>> REPLACE` line"
    )]
    NoBlocks,
    /// The reply's block markers are out of order; `line` is 1-based in the reply.
    #[error("line {line} of the reply: {why}")]
    Malformed { line: usize, why: String },
    /// A block (1-based) has no non-blank line in its SEARCH part while the source is not
    /// empty.
    #[error(
        "block {block}: its SEARCH part is empty; copy the exact lines to change from the \
         kernel into it (to add code, put the neighbouring lines in SEARCH and repeat them \
         in REPLACE)"
    )]
    EmptySearch { block: usize },
    /// A block's SEARCH text matched nowhere, even ignoring whitespace. `nearest` is the
    /// source line (1-based) most similar to the first non-blank SEARCH line, when one is
    /// similar enough to be worth naming.
    #[error(
        "block {block}: its SEARCH text is not in the kernel{}; copy the lines exactly as \
         they are in the kernel",
        nearest_note(.nearest)
    )]
    NotFound {
        block: usize,
        nearest: Option<(usize, String)>,
    },
    /// A block's SEARCH text matched `count` times, starting at these 1-based source lines.
    #[error(
        "block {block}: its SEARCH text occurs {count} times ({}); include more surrounding \
         lines so it matches once",
        line_list(.lines)
    )]
    Ambiguous {
        block: usize,
        count: usize,
        lines: Vec<usize>,
    },
    #[error("the blocks change nothing; make each REPLACE part differ from its SEARCH part")]
    NoChange,
}

/// Longest source line quoted in a [`DiffError::NotFound`] message, in chars.
const QUOTE_CHARS: usize = 160;
/// Line numbers listed in a [`DiffError::Ambiguous`] message.
const LISTED_LINES: usize = 10;
/// Chars of a line that the similarity measure looks at (bounds the work on long lines).
const SIMILARITY_CHARS: usize = 256;
/// Least similarity for a source line to be named as the closest one.
const MIN_SIMILARITY: f64 = 0.5;

fn nearest_note(nearest: &Option<(usize, String)>) -> String {
    match nearest {
        Some((line, text)) => {
            let mut quoted: String = text.chars().take(QUOTE_CHARS).collect();
            if text.chars().nth(QUOTE_CHARS).is_some() {
                quoted.push('…');
            }
            format!(" (the closest line is line {line}: `{quoted}`)")
        }
        None => String::new(),
    }
}

fn line_list(lines: &[usize]) -> String {
    let mut out = if lines.len() == 1 { "line " } else { "lines " }.to_string();
    let shown: Vec<String> = lines
        .iter()
        .take(LISTED_LINES)
        .map(|l| l.to_string())
        .collect();
    out.push_str(&shown.join(", "));
    if lines.len() > LISTED_LINES {
        out.push_str(", …");
    }
    out
}

/// A marker line of a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    Search,
    Divider,
    Replace,
}

/// Reads a marker line: 5 to 9 `<`, `=` or `>` at the start of the line, then (for `<` and
/// `>`) the word `SEARCH` or `REPLACE` in any case, then only whitespace. Leading whitespace
/// is not allowed, so indented text in a kernel is never taken for a marker.
fn marker(line: &str) -> Option<Marker> {
    let t = line.trim_end();
    let first = t.chars().next()?;
    if !matches!(first, '<' | '=' | '>') {
        return None;
    }
    let n = t.chars().take_while(|&c| c == first).count();
    if !(5..=9).contains(&n) {
        return None;
    }
    // The marker characters are ASCII, so `n` is also a byte offset.
    let word = t[n..].trim_start();
    match first {
        '=' if word.is_empty() => Some(Marker::Divider),
        '<' if word.eq_ignore_ascii_case("search") => Some(Marker::Search),
        '>' if word.eq_ignore_ascii_case("replace") => Some(Marker::Replace),
        _ => None,
    }
}

/// Where the parser is in the reply.
enum State {
    Outside,
    Search {
        start: usize,
        search: String,
    },
    Replace {
        start: usize,
        search: String,
        replace: String,
    },
}

/// Reads every SEARCH/REPLACE block of a reply, in order.
///
/// Text outside blocks (prose, fence lines, a stray `=======` such as a markdown heading
/// underline) is ignored. Lines inside a block are kept as written, except that CRLF line
/// ends become LF. Markers out of order (a REPLACE marker outside a block, a SEARCH marker
/// inside one, a block without its divider or closing marker) are [`DiffError::Malformed`];
/// a reply without blocks is [`DiffError::NoBlocks`].
pub fn parse_blocks(reply: &str) -> Result<Vec<EditBlock>, DiffError> {
    let mut blocks = Vec::new();
    let mut state = State::Outside;
    for (i, raw) in reply.split('\n').enumerate() {
        let line_no = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let mark = marker(line);
        state = match (state, mark) {
            (State::Outside, Some(Marker::Search)) => State::Search {
                start: line_no,
                search: String::new(),
            },
            (State::Outside, Some(Marker::Replace)) => {
                return Err(malformed(
                    line_no,
                    "a `>>>>>>> REPLACE` line with no `<<<<<<< SEARCH` line before it; start \
                     every block with `<<<<<<< SEARCH`"
                        .to_string(),
                ))
            }
            (State::Outside, _) => State::Outside,
            (State::Search { start, search }, Some(Marker::Divider)) => State::Replace {
                start,
                search,
                replace: String::new(),
            },
            (State::Search { start, .. }, Some(Marker::Search)) => {
                return Err(malformed(
                    line_no,
                    format!(
                        "a new `<<<<<<< SEARCH` line inside the block that starts on line \
                         {start}; separate that block's SEARCH and REPLACE parts with a \
                         `=======` line and end it with `>>>>>>> REPLACE`"
                    ),
                ))
            }
            (State::Search { start, .. }, Some(Marker::Replace)) => {
                return Err(malformed(
                    line_no,
                    format!(
                        "the block that starts on line {start} reaches `>>>>>>> REPLACE` \
                         without a `=======` line; put one between its SEARCH and REPLACE \
                         parts"
                    ),
                ))
            }
            (State::Search { start, mut search }, None) => {
                search.push_str(line);
                search.push('\n');
                State::Search { start, search }
            }
            (
                State::Replace {
                    start,
                    search,
                    replace,
                },
                Some(Marker::Replace),
            ) => {
                blocks.push(EditBlock {
                    search,
                    replace,
                    line: start,
                });
                State::Outside
            }
            (State::Replace { start, .. }, Some(Marker::Divider)) => {
                return Err(malformed(
                    line_no,
                    format!(
                        "a second `=======` line in the block that starts on line {start}; a \
                         block has one `=======` line, between its SEARCH and REPLACE parts"
                    ),
                ))
            }
            (State::Replace { start, .. }, Some(Marker::Search)) => {
                return Err(malformed(
                    line_no,
                    format!(
                        "a new `<<<<<<< SEARCH` line before the block that starts on line \
                         {start} ends; end every block with a `>>>>>>> REPLACE` line"
                    ),
                ))
            }
            (
                State::Replace {
                    start,
                    search,
                    mut replace,
                },
                None,
            ) => {
                replace.push_str(line);
                replace.push('\n');
                State::Replace {
                    start,
                    search,
                    replace,
                }
            }
        };
    }
    match state {
        State::Outside if blocks.is_empty() => Err(DiffError::NoBlocks),
        State::Outside => Ok(blocks),
        State::Search { start, .. } => Err(malformed(
            start,
            "the block that starts here has no `=======` line and no `>>>>>>> REPLACE` line; \
             finish it"
                .to_string(),
        )),
        State::Replace { start, .. } => Err(malformed(
            start,
            "the block that starts here has no `>>>>>>> REPLACE` line; end every block with one"
                .to_string(),
        )),
    }
}

fn malformed(line: usize, why: String) -> DiffError {
    DiffError::Malformed { line, why }
}

/// Splits a text into lines after turning CRLF into LF. A final newline ends the last line
/// rather than starting an empty one, so `""` has no lines and `"\n"` has one empty line.
fn lines_of(text: &str) -> Vec<String> {
    let text = text.replace("\r\n", "\n");
    if text.is_empty() {
        return Vec::new();
    }
    let body = text.strip_suffix('\n').unwrap_or(&text);
    body.split('\n').map(str::to_string).collect()
}

fn is_blank(line: &str) -> bool {
    line.trim().is_empty()
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The 0-based start of every run of `hay` lines whose keys equal `pat`'s keys.
fn find_runs(hay: &[&str], pat: &[&str]) -> Vec<usize> {
    let Some(first) = pat.first() else {
        return Vec::new();
    };
    if pat.len() > hay.len() {
        return Vec::new();
    }
    (0..=hay.len() - pat.len())
        .filter(|&i| hay[i] == *first && hay[i..i + pat.len()] == *pat)
        .collect()
}

/// Re-indents replacement lines by the change from `from` (indentation of the first
/// non-blank SEARCH line) to `to` (indentation of the source line it matched). Lines that
/// start with `from` get `to` instead; otherwise, when the change only adds whitespace, it is
/// prepended, and when it only removes whitespace, as much leading whitespace as the change
/// removes (or the line has) is stripped. Blank lines and lines that fit none of these (tabs
/// against spaces) are kept as written.
fn reindent(lines: &[String], from: &str, to: &str) -> Vec<String> {
    lines
        .iter()
        .map(|line| {
            if is_blank(line) {
                return line.clone();
            }
            if let Some(rest) = line.strip_prefix(from) {
                return format!("{to}{rest}");
            }
            if let Some(add) = to.strip_prefix(from) {
                return format!("{add}{line}");
            }
            if let Some(remove) = from.strip_prefix(to) {
                let strip = remove.chars().count();
                let cut: usize = indent_of(line)
                    .chars()
                    .take(strip)
                    .map(char::len_utf8)
                    .sum();
                return line[cut..].to_string();
            }
            line.clone()
        })
        .collect()
}

/// Applies blocks in order, each to the source as changed by the blocks before it.
///
/// Per block, the SEARCH lines are matched against contiguous runs of source lines (CRLF
/// counts as LF), trying in turn: exact lines, lines without trailing whitespace, and lines
/// without any leading or trailing whitespace (a blank SEARCH line matches only a blank
/// line). The first rule with exactly one match replaces the run with the REPLACE lines
/// (for the last rule, re-indented by the difference between the indentation of the first
/// non-blank SEARCH line and of the source line it met); a rule with several matches is
/// [`DiffError::Ambiguous`]; no match under any rule is [`DiffError::NotFound`], naming the
/// source line most similar to the first non-blank SEARCH line. A SEARCH part with no
/// non-blank line is [`DiffError::EmptySearch`], unless the source is empty or blank, in
/// which case the REPLACE part becomes the whole source.
///
/// The result keeps whether the source ended with a newline (after a whole replacement of
/// an empty source, whether the REPLACE part did), and uses CRLF if the source did. A result equal to the source (line ends aside) is [`DiffError::NoChange`].
pub fn apply_blocks(source: &str, blocks: &[EditBlock]) -> Result<Applied, DiffError> {
    if blocks.is_empty() {
        return Err(DiffError::NoBlocks);
    }
    let normalized = source.replace("\r\n", "\n");
    let crlf = normalized.len() != source.len();
    let mut trailing_newline = normalized.ends_with('\n');
    let mut lines = lines_of(&normalized);
    let mut matches = Vec::with_capacity(blocks.len());

    for (index, block) in blocks.iter().enumerate() {
        let number = index + 1;
        let search = lines_of(&block.search);
        let replace = lines_of(&block.replace);
        if search.iter().all(|l| is_blank(l)) {
            if lines.iter().all(|l| is_blank(l)) {
                // An empty parent: the replacement is the whole new source.
                let text = block.replace.replace("\r\n", "\n");
                lines = lines_of(&text);
                trailing_newline = text.ends_with('\n');
                matches.push(MatchKind::Exact);
                continue;
            }
            return Err(DiffError::EmptySearch { block: number });
        }
        let (start, kind) = locate(&lines, &search, number)?;
        let new_lines = if kind == MatchKind::Indentation {
            let k = search.iter().position(|l| !is_blank(l)).unwrap_or(0);
            let from = indent_of(&search[k]);
            let to = indent_of(&lines[start + k]);
            reindent(&replace, from, to)
        } else {
            replace
        };
        lines.splice(start..start + search.len(), new_lines);
        matches.push(kind);
    }

    let mut out = lines.join("\n");
    if trailing_newline && !lines.is_empty() {
        out.push('\n');
    }
    if out == normalized {
        return Err(DiffError::NoChange);
    }
    if crlf {
        out = out.replace('\n', "\r\n");
    }
    Ok(Applied {
        source: out,
        blocks: blocks.len(),
        matches,
    })
}

/// Finds the one run of `lines` that `search` matches, under the first matching rule.
fn locate(
    lines: &[String],
    search: &[String],
    block: usize,
) -> Result<(usize, MatchKind), DiffError> {
    fn same(s: &str) -> &str {
        s
    }
    /// What a rule compares of each line.
    type LineKey = fn(&str) -> &str;
    let rules: [(MatchKind, LineKey); 3] = [
        (MatchKind::Exact, same),
        (MatchKind::TrailingWhitespace, str::trim_end),
        (MatchKind::Indentation, str::trim),
    ];
    for (kind, key) in rules {
        let hay: Vec<&str> = lines.iter().map(|l| key(l)).collect();
        let pat: Vec<&str> = search.iter().map(|l| key(l)).collect();
        let found = find_runs(&hay, &pat);
        match found.as_slice() {
            [] => continue,
            [start] => return Ok((*start, kind)),
            _ => {
                return Err(DiffError::Ambiguous {
                    block,
                    count: found.len(),
                    lines: found.iter().map(|s| s + 1).collect(),
                })
            }
        }
    }
    let first = search
        .iter()
        .find(|l| !is_blank(l))
        .map_or("", |l| l.trim());
    Err(DiffError::NotFound {
        block,
        nearest: nearest_line(lines, first),
    })
}

/// The 1-based number and text of the first source line most similar to `target` (both
/// trimmed), if its similarity is at least [`MIN_SIMILARITY`].
fn nearest_line(lines: &[String], target: &str) -> Option<(usize, String)> {
    let a: Vec<char> = target.chars().take(SIMILARITY_CHARS).collect();
    if a.is_empty() {
        return None;
    }
    let lcs = Lcs::new(&a);
    let mut best: Option<(f64, usize)> = None;
    for (i, line) in lines.iter().enumerate() {
        let b: Vec<char> = line.trim().chars().take(SIMILARITY_CHARS).collect();
        let total = (a.len() + b.len()) as f64;
        // No line can beat twice the shorter length over the total: skip hopeless lines.
        let bound = 2.0 * a.len().min(b.len()) as f64 / total;
        if bound < MIN_SIMILARITY || best.is_some_and(|(r, _)| bound <= r) {
            continue;
        }
        let ratio = 2.0 * lcs.len_with(&b) as f64 / total;
        if ratio >= MIN_SIMILARITY && best.is_none_or(|(r, _)| ratio > r) {
            best = Some((ratio, i));
        }
    }
    best.and_then(|(_, i)| lines.get(i).map(|l| (i + 1, l.clone())))
}

/// Longest-common-subsequence length against a fixed pattern, computed bit-parallel
/// (Hyyrö's algorithm): O(|b| · |a|/64) per comparison, so scanning every line of a kernel
/// for the closest one stays cheap.
struct Lcs {
    len: usize,
    words: usize,
    masks: HashMap<char, Vec<u64>>,
}

impl Lcs {
    fn new(a: &[char]) -> Self {
        let words = a.len().div_ceil(64);
        let mut masks: HashMap<char, Vec<u64>> = HashMap::new();
        for (i, c) in a.iter().enumerate() {
            let mask = masks.entry(*c).or_insert_with(|| vec![0; words]);
            mask[i / 64] |= 1 << (i % 64);
        }
        Self {
            len: a.len(),
            words,
            masks,
        }
    }

    fn len_with(&self, b: &[char]) -> usize {
        let mut v = vec![u64::MAX; self.words];
        for c in b {
            let Some(m) = self.masks.get(c) else {
                continue;
            };
            let mut carry = false;
            for (vw, &mw) in v.iter_mut().zip(m) {
                let u = *vw & mw;
                let (s1, c1) = vw.overflowing_add(u);
                let (s2, c2) = s1.overflowing_add(u64::from(carry));
                carry = c1 || c2;
                *vw = s2 | (*vw & !mw);
            }
        }
        // Each zero bit among the pattern's positions is one matched char.
        let mut zeros = 0;
        for (w, vw) in v.iter().enumerate() {
            let bits = (self.len - w * 64).min(64);
            let mask = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
            zeros += (!vw & mask).count_ones() as usize;
        }
        zeros
    }
}

/// Parses a reply's blocks and applies them to `source` ([`parse_blocks`] then
/// [`apply_blocks`]).
pub fn apply_reply(source: &str, reply: &str) -> Result<Applied, DiffError> {
    let blocks = parse_blocks(reply)?;
    apply_blocks(source, &blocks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::{Duration, Instant};

    const KERNEL: &str = "\
__global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float acc = 0.0f;
        acc += a[i];
        acc += b[i];
        c[i] = acc;
    }
}
";

    fn block(search: &str, replace: &str) -> String {
        format!("<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n")
    }

    #[test]
    fn applies_several_blocks_in_order() {
        let reply = format!(
            "{}{}",
            block("        acc += a[i];\n", "        acc += 2.0f * a[i];\n"),
            block("        c[i] = acc;\n", "        c[i] = acc * 0.5f;\n"),
        );
        let applied = apply_reply(KERNEL, &reply).unwrap();
        assert_eq!(applied.blocks, 2);
        assert_eq!(applied.matches, vec![MatchKind::Exact, MatchKind::Exact]);
        let expected = KERNEL
            .replace("acc += a[i];", "acc += 2.0f * a[i];")
            .replace("c[i] = acc;", "c[i] = acc * 0.5f;");
        assert_eq!(applied.source, expected);
    }

    #[test]
    fn later_block_sees_the_earlier_result() {
        let reply = format!(
            "{}{}",
            block("        float acc = 0.0f;\n", "        float acc = 1.0f;\n"),
            block(
                "        float acc = 1.0f;\n        acc += a[i];\n",
                "        float acc = a[i];\n"
            ),
        );
        let applied = apply_reply(KERNEL, &reply).unwrap();
        let expected = KERNEL.replace(
            "        float acc = 0.0f;\n        acc += a[i];\n",
            "        float acc = a[i];\n",
        );
        assert_eq!(applied.source, expected);
    }

    #[test]
    fn reads_blocks_among_fences_and_prose() {
        let reply = format!(
            "Here is the change.\n\nFirst:\n```cuda\n{}```\nThen, outside a fence:\n{}\nTitle\n=======\nDone.",
            block("    int i = blockIdx.x * blockDim.x + threadIdx.x;\n", "    int i = threadIdx.x;\n"),
            block("    if (i < n) {\n", "    if (i < n && i >= 0) {\n"),
        );
        let blocks = parse_blocks(&reply).unwrap();
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0].line, 5);
        assert_eq!(blocks[1].line, 12);
        assert_eq!(blocks[1].search, "    if (i < n) {\n");
        let applied = apply_blocks(KERNEL, &blocks).unwrap();
        assert_eq!(
            applied.source,
            KERNEL
                .replace("blockIdx.x * blockDim.x + threadIdx.x", "threadIdx.x")
                .replace("if (i < n) {", "if (i < n && i >= 0) {")
        );
    }

    #[test]
    fn crlf_reply_and_crlf_source() {
        let reply = block("        acc += b[i];\n", "        acc -= b[i];\n").replace('\n', "\r\n");
        let applied = apply_reply(KERNEL, &reply).unwrap();
        assert_eq!(applied.source, KERNEL.replace("acc += b[i]", "acc -= b[i]"));
        assert_eq!(applied.matches, vec![MatchKind::Exact]);

        let crlf_kernel = KERNEL.replace('\n', "\r\n");
        let applied = apply_reply(&crlf_kernel, &reply).unwrap();
        assert_eq!(
            applied.source,
            crlf_kernel.replace("acc += b[i]", "acc -= b[i]")
        );
    }

    #[test]
    fn marker_variants() {
        let reply = "<<<<< search  \n        acc += a[i];\n=====\t\n        acc += 3.0f;\n>>>>> Replace\n\
                     <<<<<<<<< SEARCH\n        c[i] = acc;\n=========\n        c[i] = -acc;\n>>>>>>>>>REPLACE\n";
        let applied = apply_reply(KERNEL, reply).unwrap();
        assert_eq!(
            applied.source,
            KERNEL
                .replace("acc += a[i];", "acc += 3.0f;")
                .replace("c[i] = acc;", "c[i] = -acc;")
        );
        // 4 and 10 marker characters, or leading whitespace, are not markers.
        assert_eq!(
            parse_blocks("<<<< SEARCH\nx\n====\ny\n>>>> REPLACE\n"),
            Err(DiffError::NoBlocks)
        );
        assert_eq!(
            parse_blocks("<<<<<<<<<< SEARCH\nx\n==========\ny\n>>>>>>>>>> REPLACE\n"),
            Err(DiffError::NoBlocks)
        );
        assert_eq!(
            parse_blocks("  <<<<<<< SEARCH\nx\n"),
            Err(DiffError::NoBlocks)
        );
    }

    #[test]
    fn matches_ignoring_trailing_whitespace() {
        let source = "int f() {  \n    return 1;\t\n}\n";
        let reply = block("int f() {\n    return 1;\n", "int f() {\n    return 2;\n");
        let applied = apply_reply(source, &reply).unwrap();
        assert_eq!(applied.matches, vec![MatchKind::TrailingWhitespace]);
        assert_eq!(applied.source, "int f() {\n    return 2;\n}\n");
    }

    #[test]
    fn matches_ignoring_indentation_and_reindents_deeper() {
        // The model dropped the source's indentation: the replacement gets 8 spaces added.
        let reply = block(
            "acc += a[i];\nacc += b[i];\n",
            "if (a[i] > 0) {\n    acc += a[i];\n}\n\nacc += b[i];\n",
        );
        let applied = apply_reply(KERNEL, &reply).unwrap();
        assert_eq!(applied.matches, vec![MatchKind::Indentation]);
        let expected = KERNEL.replace(
            "        acc += a[i];\n        acc += b[i];\n",
            "        if (a[i] > 0) {\n            acc += a[i];\n        }\n\n        acc += b[i];\n",
        );
        assert_eq!(applied.source, expected);
    }

    #[test]
    fn matches_ignoring_indentation_and_reindents_shallower() {
        let source = "void g() {\n  x = 1;\n  y = 2;\n}\n";
        let reply = block(
            "      x = 1;\n      y = 2;\n",
            "      x = 3;\n        if (z) y = 4;\n    w = 0;\n",
        );
        let applied = apply_reply(source, &reply).unwrap();
        assert_eq!(applied.matches, vec![MatchKind::Indentation]);
        assert_eq!(
            applied.source,
            "void g() {\n  x = 3;\n    if (z) y = 4;\nw = 0;\n}\n"
        );
    }

    #[test]
    fn indentation_rule_keeps_blank_lines_significant() {
        // A blank SEARCH line must meet a blank source line.
        let source = "a\nb\nc\n";
        let reply = block("a\n\nb\n", "x\n");
        assert!(matches!(
            apply_reply(source, &reply),
            Err(DiffError::NotFound { block: 1, .. })
        ));
    }

    #[test]
    fn deletion_with_empty_replace() {
        let reply = block("        acc += b[i];\n", "");
        let applied = apply_reply(KERNEL, &reply).unwrap();
        assert_eq!(applied.source, KERNEL.replace("        acc += b[i];\n", ""));
    }

    #[test]
    fn keeps_the_trailing_newline_state() {
        let applied = apply_reply("a\nb", &block("b\n", "c\n")).unwrap();
        assert_eq!(applied.source, "a\nc");
        // Block texts without a final newline or with CRLF work too.
        let edit = EditBlock {
            search: "b".into(),
            replace: "c\r\nd".into(),
            line: 1,
        };
        let applied = apply_blocks("a\nb\n", &[edit]).unwrap();
        assert_eq!(applied.source, "a\nc\nd\n");
        let applied = apply_reply("a\n", &block("a\n", "")).unwrap();
        assert_eq!(applied.source, "");
    }

    #[test]
    fn empty_source_takes_the_replacement() {
        let applied = apply_reply("", &block("", "int main() {}\n")).unwrap();
        assert_eq!(applied.source, "int main() {}\n");
        assert_eq!(applied.matches, vec![MatchKind::Exact]);
        let applied = apply_reply("\n  \n", &block("", "x\n")).unwrap();
        assert_eq!(applied.source, "x\n");
    }

    #[test]
    fn error_no_blocks() {
        let err =
            apply_reply(KERNEL, "I think the kernel is fine.\n```c\nint x;\n```").unwrap_err();
        assert_eq!(err, DiffError::NoBlocks);
        assert!(err
            .to_string()
            .starts_with("the reply has no SEARCH/REPLACE block"));
        assert_eq!(apply_blocks(KERNEL, &[]), Err(DiffError::NoBlocks));
    }

    #[test]
    fn error_empty_search() {
        let reply = format!(
            "{}{}",
            block("    if (i < n) {\n", "    if (i < n) { // ok\n"),
            block("\n", "x\n")
        );
        let err = apply_reply(KERNEL, &reply).unwrap_err();
        assert_eq!(err, DiffError::EmptySearch { block: 2 });
        assert!(
            err.to_string()
                .starts_with("block 2: its SEARCH part is empty"),
            "{err}"
        );
    }

    #[test]
    fn error_not_found_names_the_closest_line() {
        let reply = format!(
            "{}{}",
            block("        acc += a[i];\n", "        acc += a[i] * 2.0f;\n"),
            block(
                "        float acc = 0.0;\n        acc += a[i] * 3.0f;\n",
                "x\n"
            ),
        );
        let err = apply_reply(KERNEL, &reply).unwrap_err();
        assert_eq!(
            err,
            DiffError::NotFound {
                block: 2,
                nearest: Some((4, "        float acc = 0.0f;".to_string()))
            }
        );
        assert_eq!(
            err.to_string(),
            "block 2: its SEARCH text is not in the kernel (the closest line is line 4: \
             `        float acc = 0.0f;`); copy the lines exactly as they are in the kernel"
        );
    }

    #[test]
    fn error_not_found_without_a_similar_line() {
        let err = apply_reply(KERNEL, &block("#pragma unroll 16\n", "x\n")).unwrap_err();
        assert_eq!(
            err,
            DiffError::NotFound {
                block: 1,
                nearest: None
            }
        );
        assert_eq!(
            err.to_string(),
            "block 1: its SEARCH text is not in the kernel; copy the lines exactly as they are in the kernel"
        );
        let err = apply_reply("", &block("a\n", "b\n")).unwrap_err();
        assert_eq!(
            err,
            DiffError::NotFound {
                block: 1,
                nearest: None
            }
        );
    }

    #[test]
    fn error_ambiguous_lists_the_lines() {
        let source = "x = 0;\n{\n  y++;\n}\n{\n  y++;\n}\nz;\n  y++;\n";
        let err = apply_reply(source, &block("  y++;\n", "  y--;\n")).unwrap_err();
        assert_eq!(
            err,
            DiffError::Ambiguous {
                block: 1,
                count: 3,
                lines: vec![3, 6, 9]
            }
        );
        assert_eq!(
            err.to_string(),
            "block 1: its SEARCH text occurs 3 times (lines 3, 6, 9); include more surrounding \
             lines so it matches once"
        );
        // More context makes it unique.
        let applied = apply_reply(source, &block("z;\n  y++;\n", "z;\n  y--;\n")).unwrap();
        assert_eq!(
            applied.source,
            "x = 0;\n{\n  y++;\n}\n{\n  y++;\n}\nz;\n  y--;\n"
        );
        // Ambiguity under a looser rule is reported too.
        let err = apply_reply("a \nb\na\t\n", &block("a\n", "c\n")).unwrap_err();
        assert_eq!(
            err,
            DiffError::Ambiguous {
                block: 1,
                count: 2,
                lines: vec![1, 3]
            }
        );
    }

    #[test]
    fn error_no_change() {
        let reply = block("    if (i < n) {\n", "    if (i < n) {\n");
        let err = apply_reply(KERNEL, &reply).unwrap_err();
        assert_eq!(err, DiffError::NoChange);
        assert!(err.to_string().starts_with("the blocks change nothing"));
        // Two blocks that undo each other change nothing either.
        let reply = format!(
            "{}{}",
            block("    if (i < n) {\n", "    if (i <= n) {\n"),
            block("    if (i <= n) {\n", "    if (i < n) {\n"),
        );
        assert_eq!(apply_reply(KERNEL, &reply), Err(DiffError::NoChange));
    }

    #[test]
    fn error_malformed() {
        let cases = [
            (">>>>>>> REPLACE\n", 1, "no `<<<<<<< SEARCH` line before it"),
            (
                "text\n<<<<<<< SEARCH\na\n<<<<<<< SEARCH\n",
                4,
                "inside the block that starts on line 2",
            ),
            (
                "<<<<<<< SEARCH\na\n>>>>>>> REPLACE\n",
                3,
                "without a `=======` line",
            ),
            (
                "<<<<<<< SEARCH\na\n=======\nb\n=======\n",
                5,
                "a second `=======` line",
            ),
            (
                "<<<<<<< SEARCH\na\n=======\nb\n<<<<<<< SEARCH\n",
                5,
                "before the block that starts on line 1 ends",
            ),
            (
                "x\n<<<<<<< SEARCH\na\n=======\nb\n",
                2,
                "no `>>>>>>> REPLACE` line",
            ),
            ("x\n\n<<<<<<< SEARCH\na\n", 3, "no `=======` line"),
        ];
        for (reply, line, why) in cases {
            let err = parse_blocks(reply).unwrap_err();
            let DiffError::Malformed { line: got, .. } = &err else {
                panic!("{reply:?}: {err:?}");
            };
            assert_eq!(*got, line, "{reply:?}");
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("line {line} of the reply: ")),
                "{text}"
            );
            assert!(text.contains(why), "{text}");
        }
    }

    #[test]
    fn lcs_is_exact() {
        let lcs = |a: &str, b: &str| {
            let a: Vec<char> = a.chars().collect();
            let b: Vec<char> = b.chars().collect();
            Lcs::new(&a).len_with(&b)
        };
        assert_eq!(lcs("abcbdab", "bdcaba"), 4);
        assert_eq!(lcs("abc", "xyz"), 0);
        assert_eq!(lcs("héllo wörld", "hello world"), 9);
        let long_a: String = "ab".repeat(100);
        let long_b: String = "ba".repeat(100);
        assert_eq!(lcs(&long_a, &long_b), 199);
    }

    #[test]
    fn junk_reply_is_fast() {
        let source: String = (0..3000)
            .map(|i| format!("    float v{i} = x[{i}] * {i}.0f;\n"))
            .collect();
        let mut junk = String::new();
        let mut i = 0u64;
        while junk.len() < 1 << 20 {
            i = i
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            match i >> 61 {
                0 => junk.push_str("<<<<<<< SEARCH\n"),
                1 => junk.push_str("=======\n"),
                2 => junk.push_str(&"}".repeat(5000)),
                _ => junk.push_str(&format!("    float v{} = x[{}];\n", i % 977, i % 13)),
            }
        }
        let start = Instant::now();
        let _ = apply_reply(&source, &junk);
        let body = junk
            .replace("<<<<<<< SEARCH\n", "")
            .replace("=======\n", "");
        let _ = apply_reply(
            &source,
            &format!("<<<<<<< SEARCH\n{body}\n=======\n>>>>>>> REPLACE\n"),
        );
        // Many candidate positions, each matching far before failing.
        let braces = "}\n".repeat(3000);
        let search = format!("{}x\n", "}\n".repeat(1500));
        let err = apply_reply(&braces, &block(&search, "y\n")).unwrap_err();
        assert!(matches!(err, DiffError::NotFound { block: 1, .. }));
        // Generous bound (debug build, busy machine); a quadratic scan would take minutes.
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }

    fn join(lines: &[String], trailing: bool) -> String {
        let mut s = lines.join("\n");
        if trailing && !lines.is_empty() {
            s.push('\n');
        }
        s
    }

    proptest! {
        #[test]
        fn unique_run_replacement_applies(
            lines in prop::collection::vec("[ab]{0,2}( ?[a-c]{0,2})?", 1..30),
            start in 0usize..30,
            len in 1usize..6,
            replacement in prop::collection::vec("[a-d ]{0,4}", 0..5),
            trailing in any::<bool>(),
        ) {
            let start = start % lines.len();
            let len = len.min(lines.len() - start);
            let run = &lines[start..start + len];
            // A final empty line without a final newline cannot be told from a newline.
            prop_assume!(trailing || !lines.last().is_some_and(|l| l.is_empty()));
            prop_assume!(run.iter().any(|l| !l.trim().is_empty()));
            let occurrences = (0..=lines.len() - len).filter(|&i| lines[i..i + len] == *run).count();
            prop_assume!(occurrences == 1);

            let source = join(&lines, trailing);
            let mut new_lines = lines[..start].to_vec();
            new_lines.extend(replacement.iter().cloned());
            new_lines.extend(lines[start + len..].iter().cloned());
            let expected = join(&new_lines, trailing);

            let search: String = run.iter().map(|l| format!("{l}\n")).collect();
            let replace: String = replacement.iter().map(|l| format!("{l}\n")).collect();
            let reply = format!("Change:\n```\n{}```\n", block(&search, &replace));
            let result = apply_reply(&source, &reply);
            if expected == source {
                prop_assert_eq!(result, Err(DiffError::NoChange));
            } else {
                let applied = result.unwrap();
                prop_assert_eq!(applied.source, expected);
                prop_assert_eq!(applied.matches, vec![MatchKind::Exact]);
            }
        }

        #[test]
        fn lcs_agrees_with_dynamic_programming(a in "[abc]{0,150}", b in "[abcd]{0,150}") {
            let a: Vec<char> = a.chars().collect();
            let b: Vec<char> = b.chars().collect();
            let mut row = vec![0usize; b.len() + 1];
            for ca in &a {
                let mut diagonal = 0;
                for (j, cb) in b.iter().enumerate() {
                    let above = row[j + 1];
                    row[j + 1] = if ca == cb { diagonal + 1 } else { above.max(row[j]) };
                    diagonal = above;
                }
            }
            prop_assert_eq!(Lcs::new(&a).len_with(&b), row[b.len()]);
        }

        #[test]
        fn apply_reply_never_panics_on_text(source in "\\PC{0,200}", reply in "\\PC{0,400}") {
            let _ = apply_reply(&source, &reply).map_err(|e| e.to_string());
        }

        #[test]
        fn apply_reply_never_panics_on_marker_soup(
            source in prop::collection::vec(prop_oneof!["[ \ta-c}{]{0,6}", "\\PC{0,8}"], 0..20),
            parts in prop::collection::vec(
                prop_oneof![
                    Just("<<<<<<< SEARCH".to_string()),
                    Just("<<<<< search \r".to_string()),
                    Just("=======".to_string()),
                    Just("=========  ".to_string()),
                    Just(">>>>>>> REPLACE".to_string()),
                    Just(">>>>>replace\r".to_string()),
                    Just("```".to_string()),
                    Just(String::new()),
                    "[ \ta-c}{]{0,6}",
                    "\\PC{0,8}",
                ],
                0..40,
            ),
            crlf in any::<bool>(),
        ) {
            let source = source.join("\n");
            let mut reply = parts.join("\n");
            if crlf {
                reply = reply.replace('\n', "\r\n");
            }
            match apply_reply(&source, &reply) {
                Ok(applied) => {
                    prop_assert_ne!(applied.source.replace("\r\n", "\n"), source.replace("\r\n", "\n"));
                    prop_assert_eq!(applied.matches.len(), applied.blocks);
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
