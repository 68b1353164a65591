//! Maps between field paths (`workloads[2].params.L`) and places in the TOML source, so that
//! both serde's errors (which carry a byte span) and our own checks (which know a path) can
//! report the file, the field and the line.

use std::fmt;
use std::ops::Range;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A path to a field of the document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldPath(Vec<Seg>);

impl FieldPath {
    pub(crate) fn root() -> Self {
        FieldPath(Vec::new())
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Key(key.to_string()));
        FieldPath(segs)
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut segs = self.0.clone();
        segs.push(Seg::Index(index));
        FieldPath(segs)
    }

    /// `rest` taken relative to this path (`workloads[2]` joined with `params.L`).
    pub(crate) fn join(&self, rest: &FieldPath) -> Self {
        let mut segs = self.0.clone();
        segs.extend(rest.0.iter().cloned());
        FieldPath(segs)
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A resolved place in the source.
pub(crate) struct Location {
    pub line: usize,
    pub column: usize,
    pub text: String,
}

pub(crate) struct SourceMap<'a> {
    text: &'a str,
    doc: Option<Spanned<DeTable<'a>>>,
}

impl<'a> SourceMap<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let doc = DeTable::parse(text).ok();
        SourceMap { text, doc }
    }

    pub(crate) fn text(&self) -> &'a str {
        self.text
    }

    /// The span of the value at `path`, or of its deepest existing ancestor (so a missing key
    /// points at the table that lacks it). Keys point at the key itself when the value is a
    /// table, because a table's span can cover many lines.
    pub(crate) fn span_of(&self, path: &FieldPath) -> Option<Range<usize>> {
        let doc = self.doc.as_ref()?;
        let mut best: Option<Range<usize>> = None;
        let mut table: Option<&DeTable<'a>> = Some(doc.get_ref());
        let mut value: Option<&Spanned<DeValue<'a>>> = None;
        for seg in &path.0 {
            match seg {
                Seg::Key(k) => {
                    let Some(t) = table else { break };
                    let Some((key, v)) = t.get_key_value(k.as_str()) else {
                        break;
                    };
                    best = Some(if v.get_ref().is_table() {
                        key.span()
                    } else {
                        v.span()
                    });
                    value = Some(v);
                }
                Seg::Index(i) => {
                    let Some(items) = value.and_then(|v| v.get_ref().as_array()) else {
                        break;
                    };
                    let Some(item) = items.get(*i) else { break };
                    best = Some(item.span());
                    value = Some(item);
                }
            }
            table = value.and_then(|v| v.get_ref().as_table());
        }
        best
    }

    /// The path of the innermost key or value whose span contains `offset`. A table's span
    /// covers only its header, so the search visits every node rather than pruning by span.
    pub(crate) fn path_at(&self, offset: usize) -> FieldPath {
        let Some(doc) = self.doc.as_ref() else {
            return FieldPath::root();
        };
        let mut best = None;
        search_table(doc.get_ref(), &FieldPath::root(), offset, &mut best);
        best.map(|(path, _)| path).unwrap_or_default()
    }

    pub(crate) fn locate(&self, offset: usize) -> Location {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
        let line = before.matches('\n').count() + 1;
        let column = self.text[line_start..offset].chars().count() + 1;
        let line_end = self.text[line_start..]
            .find('\n')
            .map(|i| line_start + i)
            .unwrap_or(self.text.len());
        Location {
            line,
            column,
            text: self.text[line_start..line_end].trim_end().to_string(),
        }
    }
}

/// Records in `best` the matching node with the narrowest span.
fn consider(
    path: FieldPath,
    span: Range<usize>,
    offset: usize,
    best: &mut Option<(FieldPath, usize)>,
) {
    if span.contains(&offset) {
        let width = span.end - span.start;
        if best.as_ref().is_none_or(|(_, w)| width <= *w) {
            *best = Some((path, width));
        }
    }
}

fn search_table(
    table: &DeTable<'_>,
    path: &FieldPath,
    offset: usize,
    best: &mut Option<(FieldPath, usize)>,
) {
    for (key, value) in table.iter() {
        let p = path.key(key.get_ref());
        consider(p.clone(), key.span(), offset, best);
        search_value(value, &p, offset, best);
    }
}

fn search_value(
    value: &Spanned<DeValue<'_>>,
    path: &FieldPath,
    offset: usize,
    best: &mut Option<(FieldPath, usize)>,
) {
    consider(path.clone(), value.span(), offset, best);
    match value.get_ref() {
        DeValue::Table(t) => search_table(t, path, offset, best),
        DeValue::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                search_value(item, &path.index(i), offset, best);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "name = \"x\"\n\n[axes.L]\ndescription = \"len\"\n\n[[workloads]]\nname = \"a\"\nparams = { L = 1 }\n\n[[workloads]]\nname = \"b\"\nparams = { L = \"two\" }\n";

    #[test]
    fn path_display() {
        let p = FieldPath::root()
            .key("workloads")
            .index(2)
            .key("params")
            .key("L");
        assert_eq!(p.to_string(), "workloads[2].params.L");
    }

    #[test]
    fn span_of_finds_lines() {
        let map = SourceMap::new(DOC);
        let line = |p: &FieldPath| map.locate(map.span_of(p).unwrap().start).line;
        assert_eq!(line(&FieldPath::root().key("name")), 1);
        assert_eq!(line(&FieldPath::root().key("axes").key("L")), 3);
        let w1 = FieldPath::root().key("workloads").index(1);
        assert_eq!(line(&w1.key("params").key("L")), 12);
        assert_eq!(line(&w1.key("name")), 11);
        // A missing key falls back to its table.
        assert_eq!(line(&w1.key("params").key("D")), 12);
    }

    #[test]
    fn path_at_inverts_span_of() {
        let map = SourceMap::new(DOC);
        let p = FieldPath::root()
            .key("workloads")
            .index(1)
            .key("params")
            .key("L");
        let span = map.span_of(&p).unwrap();
        assert_eq!(map.path_at(span.start).to_string(), "workloads[1].params.L");
        let loc = map.locate(span.start);
        assert_eq!(loc.text, "params = { L = \"two\" }");
        assert_eq!(loc.column, 16);
    }
}
