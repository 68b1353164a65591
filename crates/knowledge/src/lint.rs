//! Static checks of candidate code, per target, from the rules in `knowledge/packs/lint/` and
//! the forbidden identifiers of the concept maps. They run before a candidate is compiled: an
//! error finding rejects it (its message goes back to the proposer), a warning is advice.
//!
//! The checks are lexical: comments and string literals are blanked first, so text in a comment
//! never triggers a rule. For Python targets (MLX custom kernels) the checked code is the
//! contents of the module's triple-quoted strings, where kernel bodies live; each string is
//! checked on its own, so the threadgroup memory of two kernels is not added up.
//!
//! Rule kinds:
//! - `forbidden_identifiers`: the listed identifiers must not appear.
//! - `concept_forbids`: the identifiers the target's concept maps mark as absent on the target,
//!   each reported with its replacement.
//! - `static_memory_limit`: static arrays declared with `qualifier` (`threadgroup`,
//!   `__shared__`) must fit in `limit_bytes` together; sizes are evaluated from literals,
//!   `#define`s and integer constants.
//! - `index_guard`: code that reads a thread index must compare it (or a variable computed from
//!   it) with a bound in an `if`, `for` or `while` condition.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::is_identifier;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    #[default]
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleKind {
    ForbiddenIdentifiers,
    ConceptForbids,
    StaticMemoryLimit,
    IndexGuard,
}

/// One rule of `knowledge/packs/lint/*.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LintRule {
    pub id: String,
    pub kind: RuleKind,
    pub targets: Vec<String>,
    #[serde(default)]
    pub severity: Severity,
    /// The finding's text; `{ident}`, `{replacement}`, `{bytes}`, `{limit}` and `{arrays}` are
    /// filled in where the kind has them.
    pub message: String,
    pub source: String,
    /// `forbidden_identifiers`.
    #[serde(default)]
    pub identifiers: Vec<String>,
    /// `static_memory_limit`: the address-space keyword of the arrays.
    #[serde(default)]
    pub qualifier: Option<String>,
    #[serde(default)]
    pub limit_bytes: Option<u64>,
    /// `index_guard`: identifiers that hold a thread index.
    #[serde(default)]
    pub index_identifiers: Vec<String>,
}

impl LintRule {
    /// Checks the fields the rule's kind needs; `Err((field, message))`.
    pub(crate) fn validate(&self) -> Result<(), (String, String)> {
        let need = |ok: bool, field: &str, what: &str| {
            if ok {
                Ok(())
            } else {
                Err((
                    field.to_string(),
                    format!("a `{:?}` rule needs {what}", self.kind),
                ))
            }
        };
        if self.source.trim().is_empty() {
            return Err(("source".into(), "cite a source".into()));
        }
        match self.kind {
            RuleKind::ForbiddenIdentifiers => {
                need(!self.identifiers.is_empty(), "identifiers", "identifiers")?;
                if let Some(i) = self.identifiers.iter().find(|i| !is_identifier(i)) {
                    return Err(("identifiers".into(), format!("{i:?} is not an identifier")));
                }
            }
            RuleKind::ConceptForbids => {}
            RuleKind::StaticMemoryLimit => {
                need(self.qualifier.is_some(), "qualifier", "a qualifier")?;
                need(self.limit_bytes.is_some(), "limit_bytes", "limit_bytes")?;
            }
            RuleKind::IndexGuard => {
                need(
                    !self.index_identifiers.is_empty(),
                    "index_identifiers",
                    "index_identifiers",
                )?;
            }
        }
        Ok(())
    }
}

/// One problem found in a candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LintFinding {
    pub rule: String,
    pub severity: Severity,
    /// 1-based line in the candidate file.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for LintFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} [{}]", self.severity.as_str(), self.rule)?;
        if let Some(l) = self.line {
            write!(f, " line {l}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The rules of one target, ready to run (see [`crate::Packs::lint_target`]).
#[derive(Debug, Clone)]
pub struct LintTarget {
    name: String,
    language: String,
    rules: Vec<LintRule>,
    /// identifier → (replacement text, severity) from the concept maps.
    concept_forbids: BTreeMap<String, (String, Severity)>,
}

impl LintTarget {
    /// The target `name` whose candidates are written in `language`, with its `rules` and the
    /// identifiers its concept maps forbid, each with its replacement text and severity (the
    /// first entry of an identifier wins).
    pub(crate) fn new(
        name: &str,
        language: &str,
        rules: Vec<LintRule>,
        forbids: impl IntoIterator<Item = (String, String, Severity)>,
    ) -> Self {
        let mut concept_forbids = BTreeMap::new();
        for (ident, replacement, severity) in forbids {
            concept_forbids
                .entry(ident)
                .or_insert((replacement, severity));
        }
        Self {
            name: name.to_string(),
            language: language.to_string(),
            rules,
            concept_forbids,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn rules(&self) -> &[LintRule] {
        &self.rules
    }
}

/// Runs every rule of `target` on `source`. Findings are sorted by line, errors first on a tie.
pub fn lint(target: &LintTarget, source: &str) -> Vec<LintFinding> {
    let mut findings = Vec::new();
    for segment in segments(&target.language, source) {
        for rule in &target.rules {
            match rule.kind {
                RuleKind::ForbiddenIdentifiers => {
                    let list: BTreeMap<String, (String, Severity)> = rule
                        .identifiers
                        .iter()
                        .map(|i| (i.clone(), (String::new(), rule.severity)))
                        .collect();
                    forbidden(rule, &list, &segment, &mut findings);
                }
                RuleKind::ConceptForbids => {
                    forbidden(rule, &target.concept_forbids, &segment, &mut findings)
                }
                RuleKind::StaticMemoryLimit => memory_limit(rule, &segment, &mut findings),
                RuleKind::IndexGuard => index_guard(rule, &segment, &mut findings),
            }
        }
    }
    // One finding per rule and line is enough, also when two strings repeat a kernel.
    findings.sort_by(|a, b| {
        a.line
            .cmp(&b.line)
            .then(b.severity.cmp(&a.severity))
            .then(a.rule.cmp(&b.rule))
            .then(a.message.cmp(&b.message))
    });
    findings.dedup();
    findings
}

/// Only the findings that reject a candidate, as messages for the proposer.
pub fn errors(findings: &[LintFinding]) -> Vec<String> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| f.to_string())
        .collect()
}

/// Code to check, with comments and string literals blanked and every byte at its original
/// offset (so line numbers stay right).
struct Segment {
    text: String,
}

impl Segment {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|b| *b == b'\n')
            .count()
            + 1
    }
}

fn segments(language: &str, source: &str) -> Vec<Segment> {
    if language == "python" {
        let strings = python_triple_strings(source);
        if !strings.is_empty() {
            return strings
                .into_iter()
                .map(|(start, end)| {
                    // Keep only this string's contents; everything else becomes blanks.
                    let masked: String = source
                        .char_indices()
                        .map(|(i, c)| {
                            if c == '\n' || (i >= start && i < end) {
                                c
                            } else {
                                ' '
                            }
                        })
                        .collect();
                    Segment {
                        text: strip_c(&masked),
                    }
                })
                .collect();
        }
    }
    vec![Segment {
        text: strip_c(source),
    }]
}

/// Byte ranges of the contents of `"""…"""` and `'''…'''` strings.
fn python_triple_strings(source: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    let b = source.as_bytes();
    let mut in_comment = false;
    while i + 3 <= b.len() {
        if in_comment {
            if b[i] == b'\n' {
                in_comment = false;
            }
            i += 1;
            continue;
        }
        if b[i] == b'#' {
            in_comment = true;
            i += 1;
            continue;
        }
        let quote = &b[i..i + 3];
        if quote == b"\"\"\"" || quote == b"'''" {
            let start = i + 3;
            let close = source[start..]
                .find(std::str::from_utf8(quote).unwrap_or("\"\"\""))
                .map(|p| start + p);
            match close {
                Some(end) => {
                    out.push((start, end));
                    i = end + 3;
                }
                None => {
                    out.push((start, b.len()));
                    break;
                }
            }
            continue;
        }
        i += 1;
    }
    out
}

/// Blanks C/C++ comments and the contents of string and character literals, keeping newlines
/// and byte offsets.
fn strip_c(source: &str) -> String {
    #[derive(PartialEq)]
    enum S {
        Code,
        Line,
        Block,
        Str(char),
    }
    let mut out = String::with_capacity(source.len());
    let mut st = S::Code;
    let mut chars = source.chars().peekable();
    let blank = |c: char, out: &mut String| {
        if c == '\n' {
            out.push('\n');
        } else {
            // Same byte length, so offsets stay valid for multi-byte characters.
            out.extend(std::iter::repeat_n(' ', c.len_utf8()));
        }
    };
    while let Some(c) = chars.next() {
        match st {
            S::Code => match c {
                '/' if chars.peek() == Some(&'/') => {
                    st = S::Line;
                    blank(c, &mut out);
                }
                '/' if chars.peek() == Some(&'*') => {
                    st = S::Block;
                    blank(c, &mut out);
                    if let Some(n) = chars.next() {
                        blank(n, &mut out);
                    }
                }
                '"' | '\'' => {
                    st = S::Str(c);
                    out.push(c);
                }
                _ => out.push(c),
            },
            S::Line => {
                if c == '\n' {
                    st = S::Code;
                }
                blank(c, &mut out);
            }
            S::Block => {
                if c == '*' && chars.peek() == Some(&'/') {
                    blank(c, &mut out);
                    if let Some(n) = chars.next() {
                        blank(n, &mut out);
                    }
                    st = S::Code;
                } else {
                    blank(c, &mut out);
                }
            }
            S::Str(q) => {
                if c == '\\' {
                    blank(c, &mut out);
                    if let Some(n) = chars.next() {
                        blank(n, &mut out);
                    }
                } else if c == q {
                    out.push(c);
                    st = S::Code;
                } else if c == '\n' {
                    // An unterminated literal ends at the line end (as a compiler would complain).
                    out.push('\n');
                    st = S::Code;
                } else {
                    blank(c, &mut out);
                }
            }
        }
    }
    out
}

fn ident_re() -> Regex {
    // A constant pattern: cannot fail.
    Regex::new(r"[A-Za-z_][A-Za-z0-9_]*").expect("identifier regex")
}

fn identifiers(text: &str) -> impl Iterator<Item = (usize, &str)> + '_ {
    // Skip matches glued to a preceding digit or identifier char (the regex has no \b on the
    // left for `_`-led names inside numbers such as `1e5f`).
    let re = ident_re();
    let spans: Vec<(usize, usize)> = re
        .find_iter(text)
        .filter(|m| {
            m.start() == 0
                || !text[..m.start()]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|m| (m.start(), m.end()))
        .collect();
    spans.into_iter().map(move |(s, e)| (s, &text[s..e]))
}

fn fill(template: &str, vars: &[(&str, String)]) -> String {
    let mut s = template.to_string();
    for (k, v) in vars {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

fn forbidden(
    rule: &LintRule,
    list: &BTreeMap<String, (String, Severity)>,
    seg: &Segment,
    out: &mut Vec<LintFinding>,
) {
    if list.is_empty() {
        return;
    }
    let mut reported = std::collections::BTreeSet::new();
    for (offset, ident) in identifiers(&seg.text) {
        let Some((replacement, severity)) = list.get(ident) else {
            continue;
        };
        if !reported.insert(ident.to_string()) {
            continue;
        }
        out.push(LintFinding {
            rule: rule.id.clone(),
            severity: (*severity).min(rule.severity),
            line: Some(seg.line_of(offset)),
            message: fill(
                &rule.message,
                &[
                    ("ident", ident.to_string()),
                    ("replacement", replacement.clone()),
                ],
            ),
        });
    }
}

/// Bytes of one element of a scalar or vector type, for the usual Metal, CUDA and C names.
fn type_size(ty: &str) -> Option<u64> {
    let base = ty.trim_start_matches("metal::").trim_start_matches("std::");
    let scalar = |name: &str| -> Option<u64> {
        Some(match name {
            "char" | "uchar" | "int8_t" | "uint8_t" | "bool" | "signed char" => 1,
            "short" | "ushort" | "half" | "bfloat" | "__half" | "__nv_bfloat16" | "int16_t"
            | "uint16_t" | "bfloat16_t" | "float16_t" => 2,
            "int" | "uint" | "unsigned" | "float" | "int32_t" | "uint32_t" | "atomic_int"
            | "atomic_uint" | "atomic_float" => 4,
            "long" | "ulong" | "double" | "int64_t" | "uint64_t" | "size_t" => 8,
            _ => return None,
        })
    };
    if let Some(s) = scalar(base) {
        return Some(s);
    }
    // Vector types: float4, half2, uint3 (3-vectors occupy 4 elements in Metal and CUDA
    // alignment rules).
    let digits: String = base
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    if digits.len() == 1 {
        let n: u64 = digits.parse().ok()?;
        let stem = &base[..base.len() - 1];
        let stem = stem.trim_start_matches("packed_");
        let elem = scalar(stem)?;
        let lanes = match n {
            2 => 2,
            3 if base.starts_with("packed_") => 3,
            3 | 4 => 4,
            _ => return None,
        };
        return Some(elem * lanes);
    }
    None
}

/// Integer constants defined in the code: `#define N 64`, `constexpr int N = 64;`,
/// `constant uint N = 64;`, `const int N = 64;`.
fn constants(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let define = Regex::new(r"(?m)^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)[ \t]+([^\n]+)$")
        .expect("define regex");
    for c in define.captures_iter(text) {
        out.insert(c[1].to_string(), c[2].trim().to_string());
    }
    let decl = Regex::new(
        r"\b(?:static\s+)?(?:constexpr|const|constant)\s+(?:static\s+)?(?:unsigned\s+)?[A-Za-z_]\w*\s+([A-Za-z_]\w*)\s*=\s*([^;,]+);",
    )
    .expect("constant regex");
    for c in decl.captures_iter(text) {
        out.entry(c[1].to_string())
            .or_insert_with(|| c[2].trim().to_string());
    }
    out
}

/// Evaluates a small integer expression: literals, named constants, `+ - * / %`, parentheses.
fn eval_int(expr: &str, consts: &BTreeMap<String, String>, depth: u32) -> Option<i64> {
    if depth > 8 {
        return None;
    }
    struct P<'a> {
        s: &'a [u8],
        i: usize,
        consts: &'a BTreeMap<String, String>,
        depth: u32,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn expr(&mut self) -> Option<i64> {
            let mut v = self.term()?;
            loop {
                self.ws();
                match self.s.get(self.i) {
                    Some(b'+') => {
                        self.i += 1;
                        v = v.checked_add(self.term()?)?;
                    }
                    Some(b'-') => {
                        self.i += 1;
                        v = v.checked_sub(self.term()?)?;
                    }
                    _ => return Some(v),
                }
            }
        }
        fn term(&mut self) -> Option<i64> {
            let mut v = self.atom()?;
            loop {
                self.ws();
                match self.s.get(self.i) {
                    Some(b'*') => {
                        self.i += 1;
                        v = v.checked_mul(self.atom()?)?;
                    }
                    Some(b'/') => {
                        self.i += 1;
                        v = v.checked_div(self.atom()?)?;
                    }
                    Some(b'%') => {
                        self.i += 1;
                        v = v.checked_rem(self.atom()?)?;
                    }
                    _ => return Some(v),
                }
            }
        }
        fn atom(&mut self) -> Option<i64> {
            self.ws();
            let c = *self.s.get(self.i)?;
            if c == b'(' {
                self.i += 1;
                let v = self.expr()?;
                self.ws();
                if self.s.get(self.i) != Some(&b')') {
                    return None;
                }
                self.i += 1;
                return Some(v);
            }
            if c == b'-' {
                self.i += 1;
                return self.atom()?.checked_neg();
            }
            let start = self.i;
            while self.i < self.s.len()
                && (self.s[self.i].is_ascii_alphanumeric() || self.s[self.i] == b'_')
            {
                self.i += 1;
            }
            let tok = std::str::from_utf8(&self.s[start..self.i]).ok()?;
            if tok.is_empty() {
                return None;
            }
            if tok.as_bytes()[0].is_ascii_digit() {
                let digits = tok.trim_end_matches(['u', 'U', 'l', 'L']);
                return if let Some(hex) = digits.strip_prefix("0x") {
                    i64::from_str_radix(hex, 16).ok()
                } else {
                    digits.parse().ok()
                };
            }
            let def = self.consts.get(tok)?;
            eval_int(def, self.consts, self.depth + 1)
        }
    }
    let mut p = P {
        s: expr.as_bytes(),
        i: 0,
        consts,
        depth,
    };
    let v = p.expr()?;
    p.ws();
    (p.i == p.s.len()).then_some(v)
}

fn memory_limit(rule: &LintRule, seg: &Segment, out: &mut Vec<LintFinding>) {
    let (Some(qualifier), Some(limit)) = (rule.qualifier.as_deref(), rule.limit_bytes) else {
        return;
    };
    let consts = constants(&seg.text);
    let mut total: u64 = 0;
    let mut arrays: Vec<String> = Vec::new();
    let mut first_line = None;
    let dim_re = Regex::new(r"\[([^\]]*)\]").expect("dimension regex");
    for (offset, ident) in identifiers(&seg.text) {
        if ident != qualifier {
            continue;
        }
        let rest = &seg.text[offset + ident.len()..];
        if !rest.starts_with(|c: char| c.is_whitespace()) {
            continue;
        }
        let end = rest.find([';', '{', ')', ',']).unwrap_or(rest.len());
        let decl = &rest[..end];
        let (head, dims) = match decl.find('[') {
            Some(p) => (&decl[..p], &decl[p..]),
            None => (decl, ""),
        };
        // Kernel parameters (`threadgroup float* buf [[threadgroup(0)]]`), references and
        // `extern __shared__ T buf[]` are sized at launch time, not here.
        if head.contains('*') || head.contains('&') || dims.starts_with("[[") {
            continue;
        }
        if seg.text[..offset].trim_end().ends_with("extern") {
            continue;
        }
        let words: Vec<&str> = head
            .split_whitespace()
            .filter(|w| {
                !matches!(*w, "const" | "volatile" | "static") && !w.starts_with("__align__")
            })
            .collect();
        if words.len() < 2 {
            continue;
        }
        let name = words[words.len() - 1];
        let ty = words[..words.len() - 1].join(" ");
        let line = seg.line_of(offset);
        let mut elems: u64 = 1;
        let mut sized = true;
        for d in dim_re.captures_iter(dims) {
            match eval_int(&d[1], &consts, 0) {
                Some(n) if n > 0 => elems = elems.saturating_mul(n as u64),
                _ => {
                    sized = false;
                    break;
                }
            }
        }
        let size = type_size(&ty).filter(|_| sized).map(|s| s * elems);
        match size {
            Some(bytes) => {
                total = total.saturating_add(bytes);
                arrays.push(format!("`{name}` {bytes} B"));
                first_line.get_or_insert(line);
            }
            None => out.push(LintFinding {
                rule: rule.id.clone(),
                severity: Severity::Warning,
                line: Some(line),
                message: format!(
                    "cannot size {qualifier} array `{name}` ({ty}{dims}): make sure all {qualifier} \
                     arrays together stay within {limit} bytes"
                ),
            }),
        }
    }
    if total > limit {
        out.push(LintFinding {
            rule: rule.id.clone(),
            severity: rule.severity,
            line: first_line,
            message: fill(
                &rule.message,
                &[
                    ("bytes", total.to_string()),
                    ("limit", limit.to_string()),
                    ("arrays", arrays.join(", ")),
                ],
            ),
        });
    }
}

/// The text inside the parentheses that open at byte `open` (exclusive), if balanced.
fn paren_contents(text: &str, open: usize) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open + 1..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

fn has_comparison(cond: &str) -> bool {
    let b = cond.as_bytes();
    (0..b.len()).any(|i| {
        let c = b[i];
        if c != b'<' && c != b'>' {
            return false;
        }
        let prev = if i > 0 { b[i - 1] } else { b' ' };
        let next = b.get(i + 1).copied().unwrap_or(b' ');
        // `<<`, `>>` are shifts, `->` is a member access.
        !(next == c || prev == c || (c == b'>' && prev == b'-'))
    })
}

fn index_guard(rule: &LintRule, seg: &Segment, out: &mut Vec<LintFinding>) {
    let text = &seg.text;
    let index: Vec<(usize, &str)> = identifiers(text)
        .filter(|(_, id)| rule.index_identifiers.iter().any(|x| x == id))
        .collect();
    let Some(&(first, _)) = index.first() else {
        return;
    };
    // Names that hold an index: the identifiers themselves, attribute-bound parameters
    // (`uint3 gid [[thread_position_in_grid]]`) and variables assigned from either.
    let mut names: Vec<String> = rule.index_identifiers.clone();
    let attr = Regex::new(r"([A-Za-z_]\w*)\s*\[\[\s*([A-Za-z_]\w*)\s*\]\]").expect("attr regex");
    for c in attr.captures_iter(text) {
        if rule.index_identifiers.iter().any(|x| x == &c[2]) {
            names.push(c[1].to_string());
        }
    }
    let assign = Regex::new(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\])?\s*[+\-*/]?=\s*([^;]*);")
        .expect("assignment regex");
    for _ in 0..4 {
        let before = names.len();
        for c in assign.captures_iter(text) {
            let lhs = &c[1];
            if c[0].contains("==") || names.iter().any(|n| n == lhs) {
                continue;
            }
            if identifiers(&c[2]).any(|(_, id)| names.iter().any(|n| n == id)) {
                names.push(lhs.to_string());
            }
        }
        if names.len() == before {
            break;
        }
    }
    let mentions = |cond: &str| identifiers(cond).any(|(_, id)| names.iter().any(|n| n == id));
    let mut guarded = false;
    for (offset, kw) in identifiers(text) {
        if !matches!(kw, "if" | "while" | "for") {
            continue;
        }
        let after = offset + kw.len();
        let Some(open) = text[after..].find(|c: char| !c.is_whitespace()) else {
            continue;
        };
        if text.as_bytes().get(after + open) != Some(&b'(') {
            continue;
        }
        let Some(inner) = paren_contents(text, after + open) else {
            continue;
        };
        let cond = if kw == "for" {
            inner.split(';').nth(1).unwrap_or("")
        } else {
            inner
        };
        if has_comparison(cond) && mentions(cond) {
            guarded = true;
            break;
        }
    }
    if !guarded {
        out.push(LintFinding {
            rule: rule.id.clone(),
            severity: rule.severity,
            line: Some(seg.line_of(first)),
            message: rule.message.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripping_keeps_offsets_and_blanks_comments_and_strings() {
        let src = "int a; // __syncthreads()\n/* threadIdx\n */ char* s = \"blockIdx\"; x";
        let out = strip_c(src);
        assert_eq!(out.len(), src.len());
        assert_eq!(out.lines().count(), src.lines().count());
        assert!(!out.contains("__syncthreads"));
        assert!(!out.contains("threadIdx"));
        assert!(!out.contains("blockIdx"));
        assert!(out.ends_with("\"\"; x") || out.contains("\"        \"; x"));
    }

    #[test]
    fn integer_expressions_resolve_through_constants() {
        let consts = constants(
            "#define BM 64\nconstexpr int BK = 32;\nconstant uint PAD = BK + 1;\n#define LOOP LOOP\n",
        );
        assert_eq!(eval_int("BM * PAD", &consts, 0), Some(64 * 33));
        assert_eq!(eval_int("(BM + 4) / 2 % 5", &consts, 0), Some(4));
        assert_eq!(eval_int("0x10u", &consts, 0), Some(16));
        assert_eq!(eval_int("UNKNOWN * 2", &consts, 0), None);
        // A self-referential macro ends instead of recursing forever.
        assert_eq!(eval_int("LOOP", &consts, 0), None);
    }

    #[test]
    fn type_sizes_cover_vectors() {
        assert_eq!(type_size("float"), Some(4));
        assert_eq!(type_size("half4"), Some(8));
        assert_eq!(type_size("float3"), Some(16));
        assert_eq!(type_size("packed_float3"), Some(12));
        assert_eq!(type_size("simdgroup_float8x8"), None);
    }

    #[test]
    fn comparisons_are_not_shifts_or_arrows() {
        assert!(has_comparison("i < n"));
        assert!(has_comparison("gid.x >= size"));
        assert!(!has_comparison("a << 2"));
        assert!(!has_comparison("p->n"));
    }

    #[test]
    fn python_strings_are_found() {
        let src = "# a \"\"\" in a comment\nk = mx.fast.metal_kernel(source=\"\"\"\nbody\n\"\"\")\nh = '''x'''\n";
        let spans = python_triple_strings(src);
        assert_eq!(spans.len(), 2);
        assert_eq!(&src[spans[0].0..spans[0].1], "\nbody\n");
        assert_eq!(&src[spans[1].0..spans[1].1], "x");
    }
}
