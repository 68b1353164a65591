//! Shape and formula expressions: `+ - * / // %`, parentheses, unary minus, `min`, `max`,
//! `ceil_div`, integer and float literals, and identifiers bound by the caller (axes).
//!
//! Values stay integers as long as the arithmetic is exact, so a shape like `L / 2` is an
//! integer when `L` is even and a float (which shapes reject) when it is not. Integer overflow
//! and division by zero are errors, never wrap-around or infinities.

use serde::{Serialize, Serializer};
use std::fmt;

/// A value computed by an expression.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    pub fn as_f64(self) -> f64 {
        match self {
            Num::Int(i) => i as f64,
            Num::Float(f) => f,
        }
    }
}

impl fmt::Display for Num {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Int(i) => write!(f, "{i}"),
            Num::Float(x) => write!(f, "{x}"),
        }
    }
}

/// Why an expression could not be parsed or evaluated. `offset` is the byte offset in the
/// expression text when the problem has a position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ExprError {
    pub message: String,
    pub offset: Option<usize>,
}

impl ExprError {
    fn at(offset: usize, message: impl Into<String>) -> Self {
        ExprError {
            message: message.into(),
            offset: Some(offset),
        }
    }

    fn plain(message: impl Into<String>) -> Self {
        ExprError {
            message: message.into(),
            offset: None,
        }
    }
}

/// The functions an expression may call, with their arity.
pub const FUNCTIONS: &[(&str, usize)] = &[("min", 2), ("max", 2), ("ceil_div", 2)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    FloorDiv,
    Mod,
}

impl BinOp {
    fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::FloorDiv => "//",
            BinOp::Mod => "%",
        }
    }

    fn precedence(self) -> u8 {
        match self {
            BinOp::Add | BinOp::Sub => 1,
            BinOp::Mul | BinOp::Div | BinOp::FloorDiv | BinOp::Mod => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Lit(Num),
    Ident { name: String, offset: usize },
    Neg(Box<Node>),
    Bin(BinOp, Box<Node>, Box<Node>),
    Call { name: String, args: Vec<Node> },
}

/// A parsed expression; it keeps its source text for messages and serialization.
#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    source: String,
    root: Node,
}

impl Expr {
    /// Parses `source`; errors carry the byte offset of the problem.
    pub fn parse(source: &str) -> Result<Expr, ExprError> {
        let tokens = tokenize(source)?;
        let mut parser = Parser {
            tokens: &tokens,
            pos: 0,
            end: source.len(),
            depth: 0,
        };
        let root = parser.expr(0)?;
        if let Some(tok) = parser.peek() {
            return Err(ExprError::at(
                tok.offset,
                format!("unexpected {} after a complete expression", tok.kind),
            ));
        }
        Ok(Expr {
            source: source.to_string(),
            root,
        })
    }

    /// An expression that is just an integer literal (shape entries written as TOML integers).
    pub fn int(value: i64) -> Expr {
        Expr {
            source: value.to_string(),
            root: Node::Lit(Num::Int(value)),
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Every identifier the expression reads (not function names), in order of appearance,
    /// with its byte offset.
    pub fn identifiers(&self) -> Vec<(&str, usize)> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<(&'a str, usize)>) {
            match node {
                Node::Lit(_) => {}
                Node::Ident { name, offset } => out.push((name, *offset)),
                Node::Neg(inner) => walk(inner, out),
                Node::Bin(_, a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                Node::Call { args, .. } => args.iter().for_each(|a| walk(a, out)),
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out
    }

    /// Evaluates with `lookup` binding identifiers.
    pub fn eval(&self, lookup: &dyn Fn(&str) -> Option<Num>) -> Result<Num, ExprError> {
        eval(&self.root, lookup)
    }

    /// Evaluates and requires an exact integer.
    pub fn eval_int(&self, lookup: &dyn Fn(&str) -> Option<Num>) -> Result<i64, ExprError> {
        match self.eval(lookup)? {
            Num::Int(i) => Ok(i),
            Num::Float(x) => Err(ExprError::plain(format!(
                "`{}` = {x} is not an integer (`/` must divide exactly here; use `//` or \
                 `ceil_div` to round)",
                self.source
            ))),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum TokKind {
    Int(i64),
    Float(f64),
    Ident(String),
    Op(BinOp),
    LParen,
    RParen,
    Comma,
}

impl fmt::Display for TokKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokKind::Int(i) => write!(f, "number `{i}`"),
            TokKind::Float(x) => write!(f, "number `{x}`"),
            TokKind::Ident(name) => write!(f, "name `{name}`"),
            TokKind::Op(op) => write!(f, "`{}`", op.symbol()),
            TokKind::LParen => f.write_str("`(`"),
            TokKind::RParen => f.write_str("`)`"),
            TokKind::Comma => f.write_str("`,`"),
        }
    }
}

#[derive(Debug, Clone)]
struct Token {
    kind: TokKind,
    offset: usize,
}

fn tokenize(src: &str) -> Result<Vec<Token>, ExprError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let kind = match c {
            b' ' | b'\t' => {
                i += 1;
                continue;
            }
            b'+' => TokKind::Op(BinOp::Add),
            b'-' => TokKind::Op(BinOp::Sub),
            b'*' => {
                if bytes.get(i + 1) == Some(&b'*') {
                    return Err(ExprError::at(i, "`**` (power) is not supported"));
                }
                TokKind::Op(BinOp::Mul)
            }
            b'/' => {
                if bytes.get(i + 1) == Some(&b'/') {
                    i += 1;
                    TokKind::Op(BinOp::FloorDiv)
                } else {
                    TokKind::Op(BinOp::Div)
                }
            }
            b'%' => TokKind::Op(BinOp::Mod),
            b'(' => TokKind::LParen,
            b')' => TokKind::RParen,
            b',' => TokKind::Comma,
            b'0'..=b'9' | b'.' => {
                let (kind, len) = number(&src[i..], i)?;
                i += len;
                out.push(Token {
                    kind,
                    offset: start,
                });
                continue;
            }
            c if c == b'_' || c.is_ascii_alphabetic() => {
                while i < bytes.len() && (bytes[i] == b'_' || bytes[i].is_ascii_alphanumeric()) {
                    i += 1;
                }
                out.push(Token {
                    kind: TokKind::Ident(src[start..i].to_string()),
                    offset: start,
                });
                continue;
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(ExprError::at(i, format!("unexpected character `{ch}`")));
            }
        };
        i += 1;
        out.push(Token {
            kind,
            offset: start,
        });
    }
    Ok(out)
}

/// Scans a number at the start of `s` (`offset` is its position in the whole expression).
fn number(s: &str, offset: usize) -> Result<(TokKind, usize), ExprError> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut is_float = false;
    while i < b.len() && b[i].is_ascii_digit() {
        i += 1;
    }
    if i < b.len() && b[i] == b'.' {
        is_float = true;
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            is_float = true;
            i = j;
        }
    }
    if i < b.len() && (b[i] == b'_' || b[i].is_ascii_alphabetic()) {
        return Err(ExprError::at(
            offset,
            format!("malformed number `{}`", &s[..=i]),
        ));
    }
    let text = &s[..i];
    if is_float {
        match text.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok((TokKind::Float(x), i)),
            _ => Err(ExprError::at(offset, format!("malformed number `{text}`"))),
        }
    } else {
        text.parse::<i64>()
            .map(|v| (TokKind::Int(v), i))
            .map_err(|_| ExprError::at(offset, format!("integer `{text}` is too large")))
    }
}

struct Parser<'t> {
    tokens: &'t [Token],
    pos: usize,
    end: usize,
    /// Nesting of the recursive descent (parentheses, calls, unary signs).
    depth: usize,
}

/// Nesting levels an expression may have. Every recursion of the parser (and of evaluating,
/// walking and dropping the tree) goes through `unary`, so this bounds the stack: without it a
/// few thousand `(` in a task file overflowed the stack and aborted the process.
const MAX_DEPTH: usize = 128;

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<&Token> {
        let tok = self.tokens.get(self.pos);
        self.pos += 1;
        tok
    }

    /// Precedence climbing: parses operators binding at least as tightly as `min_prec`.
    fn expr(&mut self, min_prec: u8) -> Result<Node, ExprError> {
        let mut lhs = self.unary()?;
        while let Some(Token {
            kind: TokKind::Op(op),
            ..
        }) = self.peek()
        {
            let op = *op;
            if op.precedence() < min_prec {
                break;
            }
            self.pos += 1;
            // Left associative: the right side only takes strictly tighter operators.
            let rhs = self.expr(op.precedence() + 1)?;
            lhs = Node::Bin(op, Box::new(lhs), Box::new(rhs));
        }
        Ok(lhs)
    }

    fn unary(&mut self) -> Result<Node, ExprError> {
        if self.depth >= MAX_DEPTH {
            let offset = self.peek().map_or(self.end, |t| t.offset);
            return Err(ExprError::at(
                offset,
                format!("the expression is nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        self.depth += 1;
        let node = self.unary_inner();
        self.depth -= 1;
        node
    }

    fn unary_inner(&mut self) -> Result<Node, ExprError> {
        match self.peek() {
            Some(Token {
                kind: TokKind::Op(BinOp::Sub),
                ..
            }) => {
                self.pos += 1;
                Ok(Node::Neg(Box::new(self.unary()?)))
            }
            Some(Token {
                kind: TokKind::Op(BinOp::Add),
                ..
            }) => {
                self.pos += 1;
                self.unary()
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Node, ExprError> {
        let end = self.end;
        let Some(tok) = self.next().cloned() else {
            return Err(ExprError::at(end, "expected a value, found the end"));
        };
        match tok.kind {
            TokKind::Int(i) => Ok(Node::Lit(Num::Int(i))),
            TokKind::Float(x) => Ok(Node::Lit(Num::Float(x))),
            TokKind::LParen => {
                let inner = self.expr(0)?;
                self.expect_rparen(tok.offset)?;
                Ok(inner)
            }
            TokKind::Ident(name) => {
                if !matches!(self.peek().map(|t| &t.kind), Some(TokKind::LParen)) {
                    return Ok(Node::Ident {
                        name,
                        offset: tok.offset,
                    });
                }
                let open = self.next().map(|t| t.offset).unwrap_or(end);
                let Some(&(_, arity)) = FUNCTIONS.iter().find(|(f, _)| *f == name) else {
                    let known: Vec<_> = FUNCTIONS.iter().map(|(f, _)| *f).collect();
                    return Err(ExprError::at(
                        tok.offset,
                        format!("unknown function `{name}` (known: {})", known.join(", ")),
                    ));
                };
                let mut args = Vec::new();
                if matches!(self.peek().map(|t| &t.kind), Some(TokKind::RParen)) {
                    self.pos += 1;
                } else {
                    loop {
                        args.push(self.expr(0)?);
                        match self.next().map(|t| (t.kind.clone(), t.offset)) {
                            Some((TokKind::Comma, _)) => continue,
                            Some((TokKind::RParen, _)) => break,
                            Some((kind, offset)) => {
                                return Err(ExprError::at(
                                    offset,
                                    format!(
                                        "expected `,` or `)` in the call of `{name}`, found {kind}"
                                    ),
                                ))
                            }
                            None => {
                                return Err(ExprError::at(
                                    open,
                                    format!("unclosed `(` in the call of `{name}`"),
                                ))
                            }
                        }
                    }
                }
                if args.len() != arity {
                    return Err(ExprError::at(
                        tok.offset,
                        format!("`{name}` takes {arity} arguments, {} given", args.len()),
                    ));
                }
                Ok(Node::Call { name, args })
            }
            other => Err(ExprError::at(
                tok.offset,
                format!("expected a value, found {other}"),
            )),
        }
    }

    fn expect_rparen(&mut self, open: usize) -> Result<(), ExprError> {
        match self.next().map(|t| (t.kind.clone(), t.offset)) {
            Some((TokKind::RParen, _)) => Ok(()),
            Some((kind, offset)) => {
                Err(ExprError::at(offset, format!("expected `)`, found {kind}")))
            }
            None => Err(ExprError::at(open, "unclosed `(`")),
        }
    }
}

fn overflow(op: &str) -> ExprError {
    ExprError::plain(format!("integer overflow in `{op}`"))
}

fn eval(node: &Node, lookup: &dyn Fn(&str) -> Option<Num>) -> Result<Num, ExprError> {
    match node {
        Node::Lit(n) => Ok(*n),
        Node::Ident { name, offset } => {
            lookup(name).ok_or_else(|| ExprError::at(*offset, format!("unknown name `{name}`")))
        }
        Node::Neg(inner) => match eval(inner, lookup)? {
            Num::Int(i) => i.checked_neg().map(Num::Int).ok_or_else(|| overflow("-")),
            Num::Float(x) => Ok(Num::Float(-x)),
        },
        Node::Bin(op, a, b) => binary(*op, eval(a, lookup)?, eval(b, lookup)?),
        Node::Call { name, args } => {
            let a = eval(&args[0], lookup)?;
            let b = eval(&args[1], lookup)?;
            match name.as_str() {
                "min" => Ok(match (a, b) {
                    (Num::Int(x), Num::Int(y)) => Num::Int(x.min(y)),
                    _ => Num::Float(a.as_f64().min(b.as_f64())),
                }),
                "max" => Ok(match (a, b) {
                    (Num::Int(x), Num::Int(y)) => Num::Int(x.max(y)),
                    _ => Num::Float(a.as_f64().max(b.as_f64())),
                }),
                "ceil_div" => match (a, b) {
                    (_, Num::Int(0)) => Err(ExprError::plain("division by zero in `ceil_div`")),
                    (Num::Int(x), Num::Int(y)) => {
                        let q = x.checked_div(y).ok_or_else(|| overflow("ceil_div"))?;
                        let rounds_up = x % y != 0 && ((x < 0) == (y < 0));
                        Ok(Num::Int(if rounds_up { q + 1 } else { q }))
                    }
                    _ => {
                        float_div(a.as_f64(), b.as_f64(), "ceil_div").map(|q| Num::Float(q.ceil()))
                    }
                },
                // The parser only builds calls of known functions.
                other => Err(ExprError::plain(format!("unknown function `{other}`"))),
            }
        }
    }
}

fn float_div(a: f64, b: f64, op: &str) -> Result<f64, ExprError> {
    if b == 0.0 {
        Err(ExprError::plain(format!("division by zero in `{op}`")))
    } else {
        Ok(a / b)
    }
}

fn binary(op: BinOp, a: Num, b: Num) -> Result<Num, ExprError> {
    let sym = op.symbol();
    if let (Num::Int(x), Num::Int(y)) = (a, b) {
        return match op {
            BinOp::Add => x.checked_add(y).map(Num::Int).ok_or_else(|| overflow(sym)),
            BinOp::Sub => x.checked_sub(y).map(Num::Int).ok_or_else(|| overflow(sym)),
            BinOp::Mul => x.checked_mul(y).map(Num::Int).ok_or_else(|| overflow(sym)),
            _ if y == 0 => Err(ExprError::plain(format!("division by zero in `{sym}`"))),
            BinOp::Div => {
                if x.checked_rem(y).ok_or_else(|| overflow(sym))? == 0 {
                    x.checked_div(y).map(Num::Int).ok_or_else(|| overflow(sym))
                } else {
                    Ok(Num::Float(x as f64 / y as f64))
                }
            }
            // Python semantics: floor division and a remainder with the divisor's sign.
            BinOp::FloorDiv => {
                let q = x.checked_div(y).ok_or_else(|| overflow(sym))?;
                let adjust = x % y != 0 && ((x < 0) != (y < 0));
                Ok(Num::Int(if adjust { q - 1 } else { q }))
            }
            BinOp::Mod => {
                let r = x.checked_rem(y).ok_or_else(|| overflow(sym))?;
                Ok(Num::Int(if r != 0 && ((r < 0) != (y < 0)) {
                    r + y
                } else {
                    r
                }))
            }
        };
    }
    let (x, y) = (a.as_f64(), b.as_f64());
    let value = match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => float_div(x, y, sym)?,
        BinOp::FloorDiv => float_div(x, y, sym)?.floor(),
        BinOp::Mod => {
            let q = float_div(x, y, sym)?.floor();
            x - q * y
        }
    };
    if value.is_finite() {
        Ok(Num::Float(value))
    } else {
        Err(ExprError::plain(format!(
            "`{sym}` gives a non-finite value"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn env(pairs: &[(&str, i64)]) -> BTreeMap<String, Num> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Num::Int(*v)))
            .collect()
    }

    fn ev(src: &str, vars: &[(&str, i64)]) -> Result<Num, ExprError> {
        let env = env(vars);
        Expr::parse(src)?.eval(&|name| env.get(name).copied())
    }

    fn int(src: &str) -> i64 {
        match ev(src, &[("L", 10), ("D", 64), ("B", 3)]) {
            Ok(Num::Int(i)) => i,
            other => panic!("{src}: expected an int, got {other:?}"),
        }
    }

    fn float(src: &str) -> f64 {
        match ev(src, &[("L", 10), ("D", 64), ("B", 3)]) {
            Ok(Num::Float(x)) => x,
            other => panic!("{src}: expected a float, got {other:?}"),
        }
    }

    fn err(src: &str) -> ExprError {
        match ev(src, &[("L", 10), ("D", 64), ("B", 3)]) {
            Err(e) => e,
            Ok(v) => panic!("{src}: expected an error, got {v:?}"),
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        // Found by the task_toml fuzz target's corpus: 5,000 `(` aborted the process.
        for deep in [
            format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000)),
            format!("{}1", "-".repeat(100_000)),
            format!("{}1{}", "min(1, ".repeat(50_000), ")".repeat(50_000)),
        ] {
            let e = Expr::parse(&deep).unwrap_err();
            assert!(e.to_string().contains("nested more than 128"), "{e}");
        }
        // Ordinary nesting is untouched.
        let ok = format!("{}7{}", "(".repeat(100), ")".repeat(100));
        assert_eq!(int(&ok), 7);
        assert_eq!(int(&format!("{}7", "- ".repeat(120))), 7);
    }

    #[test]
    fn precedence_and_associativity() {
        assert_eq!(int("2 + 3 * 4"), 14);
        assert_eq!(int("(2 + 3) * 4"), 20);
        assert_eq!(int("10 - 4 - 3"), 3);
        assert_eq!(int("64 / 4 / 2"), 8);
        assert_eq!(int("2 * 3 % 4"), 2);
        assert_eq!(int("2 + 3 % 2"), 3);
        assert_eq!(int("-2 * 3 + 10"), 4);
        assert_eq!(int("-(2 + 3)"), -5);
        assert_eq!(int("--4"), 4);
        assert_eq!(int("+4 - -4"), 8);
        assert_eq!(int("B * L * D"), 1920);
        assert_eq!(int("4 * (4 * B * L * D)"), 30720);
    }

    #[test]
    fn division_kinds() {
        assert_eq!(int("D / 2"), 32);
        assert_eq!(float("L / 4"), 2.5);
        assert_eq!(int("L // 4"), 2);
        assert_eq!(int("-7 // 2"), -4);
        assert_eq!(int("7 // -2"), -4);
        assert_eq!(int("-7 % 3"), 2);
        assert_eq!(int("7 % -3"), -2);
        assert_eq!(int("L % 4"), 2);
        assert_eq!(float("7.5 // 2"), 3.0);
        assert_eq!(float("-7.5 % 2"), 0.5);
    }

    #[test]
    fn functions() {
        assert_eq!(int("min(L, D)"), 10);
        assert_eq!(int("max(L, D) + 1"), 65);
        assert_eq!(int("ceil_div(L, 4)"), 3);
        assert_eq!(int("ceil_div(L, 5)"), 2);
        assert_eq!(int("ceil_div(-7, 2)"), -3);
        assert_eq!(int("ceil_div(L, 16) * 16"), 16);
        assert_eq!(int("min(max(1, 2), ceil_div(D, 3))"), 2);
        assert_eq!(float("max(L, 0.5)"), 10.0);
        assert_eq!(float("ceil_div(7.0, 2)"), 4.0);
    }

    #[test]
    fn floats_and_literals() {
        assert_eq!(float("0.5 * L"), 5.0);
        assert_eq!(float("1e3"), 1000.0);
        assert_eq!(float("2.5e-1 * 4"), 1.0);
        assert_eq!(float(".5 + 1"), 1.5);
        assert_eq!(int("  L*D  "), 640);
    }

    #[test]
    fn eval_int_rejects_inexact_division() {
        let e = Expr::parse("L / 4").unwrap();
        let lookup = |n: &str| (n == "L").then_some(Num::Int(10));
        let msg = e.eval_int(&lookup).unwrap_err().message;
        assert!(msg.contains("2.5 is not an integer"), "{msg}");
        let lookup = |n: &str| (n == "L").then_some(Num::Int(12));
        assert_eq!(e.eval_int(&lookup).unwrap(), 3);
    }

    #[test]
    fn parse_errors_point_at_the_problem() {
        let e = err("L +");
        assert_eq!(e.offset, Some(3));
        assert!(e.message.contains("end"), "{}", e.message);

        let e = err("(L + 1");
        assert_eq!(e.offset, Some(0));
        assert!(e.message.contains("unclosed"), "{}", e.message);

        let e = err("L + 1)");
        assert_eq!(e.offset, Some(5));

        let e = err("L $ 2");
        assert_eq!(e.offset, Some(2));
        assert!(e.message.contains('$'));

        let e = err("L ** 2");
        assert!(e.message.contains("power"), "{}", e.message);

        let e = err("sqrt(L)");
        assert!(
            e.message.contains("unknown function `sqrt`"),
            "{}",
            e.message
        );

        let e = err("min(L)");
        assert!(
            e.message.contains("takes 2 arguments, 1 given"),
            "{}",
            e.message
        );

        let e = err("min(L, D");
        assert!(e.message.contains("unclosed"), "{}", e.message);

        let e = err("L D");
        assert!(
            e.message.contains("after a complete expression"),
            "{}",
            e.message
        );

        let e = err("12abc");
        assert!(e.message.contains("malformed number"), "{}", e.message);

        let e = err("99999999999999999999");
        assert!(e.message.contains("too large"), "{}", e.message);

        let e = err("");
        assert!(e.message.contains("expected a value"), "{}", e.message);

        let e = err("L × 2");
        assert_eq!(e.offset, Some(2));
        assert!(e.message.contains('×'), "{}", e.message);

        let e = err("* 2");
        assert_eq!(e.offset, Some(0));
    }

    #[test]
    fn evaluation_errors() {
        let e = err("Q + 1");
        assert_eq!(e.message, "unknown name `Q`");
        assert_eq!(e.offset, Some(0));
        assert!(err("L / 0").message.contains("division by zero"));
        assert!(err("L // (D - 64)").message.contains("division by zero"));
        assert!(err("L % 0").message.contains("division by zero"));
        assert!(err("ceil_div(L, 0)").message.contains("division by zero"));
        assert!(err("1.0 / 0").message.contains("division by zero"));
        assert!(err("9223372036854775807 + 1").message.contains("overflow"));
        assert!(err("4611686018427387904 * 2").message.contains("overflow"));
        assert!(err("-9223372036854775807 - 2").message.contains("overflow"));
    }

    #[test]
    fn identifiers_in_order() {
        let e = Expr::parse("ceil_div(L, BLOCK) * D + L").unwrap();
        let names: Vec<_> = e.identifiers().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["L", "BLOCK", "D", "L"]);
        assert_eq!(e.identifiers()[1].1, 12);
    }

    #[test]
    fn serializes_as_source() {
        let e = Expr::parse("B * H").unwrap();
        assert_eq!(serde_json::to_string(&e).unwrap(), "\"B * H\"");
        assert_eq!(e.to_string(), "B * H");
    }
}
