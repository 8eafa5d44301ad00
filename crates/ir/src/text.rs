//! The deterministic text form (`%3 = add(%1, %2) : f32[256,1024]`) and its parser.
//!
//! One line per node, in [`Graph::topo_order`] order, nodes renumbered `0, 1, 2, …`:
//!
//! ```text
//! %0 = input() {name="x"} : f32[2,3]
//! %1 = exp(%0) : f32[2,3]  // e
//! %2 = reduce(%1) {kind=sum, axes=[1], keep_dims=false} : f32[2]
//! ```
//!
//! Attributes go in braces between the operands and the type, every field of the [`Op`] in a
//! fixed order; f64 values print with `{:?}` (exact, including `inf`, `-inf` and `NaN`). A
//! node's debug name follows as a trailing `// name` comment (inputs and parameters carry
//! theirs as the `name` attribute, so the comment only appears when the debug name differs).
//! [`parse`] reads the form back, and `print(&parse(&print(g))?) == print(g)` for every graph.
//!
//! A [`Program`] adds what a graph alone does not say: which values the computation returns
//! and which parameters it updates (a training step's new weights). [`print_program`] writes
//! them after the nodes, and [`parse_program`] reads them back:
//!
//! ```text
//! outputs(%2)
//! update(%5) {name="w"}
//! ```
//!
//! Without an `outputs` line a program's outputs are the nodes nothing uses.

use crate::{BinaryOp, DType, Graph, IrError, NodeId, Op, PoolKind, ReduceKind, Result, TensorType, UnaryOp};
use std::collections::HashMap;
use std::fmt::Write;

/// The largest integer the parser accepts in a shape or an integer attribute; together with
/// the element-count check on every shape it keeps the typing rules' arithmetic from
/// overflowing on hostile input.
const MAX_INT: usize = u32::MAX as usize;

/// Prints `g` in the text form: one line per node in topological order, each ending in `\n`.
///
/// Node numbers are positions in that order, so the output does not depend on the graph's
/// internal indices. (A graph with a cycle, which [`crate::verify()`] rejects, prints in id
/// order.)
pub fn print(g: &Graph) -> String {
    let order = print_order(g);
    let num = numbers(g);
    let mut out = String::new();
    for (i, &id) in order.iter().enumerate() {
        let node = g.node(id);
        let operands: Vec<String> = g.operands(id).iter().map(|o| format!("%{}", num[o])).collect();
        let _ = write!(out, "%{i} = {}({})", node.op.name(), operands.join(", "));
        let attrs = attributes(&node.op);
        if !attrs.is_empty() {
            let _ = write!(out, " {{{}}}", attrs.join(", "));
        }
        let _ = write!(out, " : {}", node.ty);
        if let Some(name) = &node.name {
            let carried = matches!(&node.op, Op::Input { name: n } | Op::Parameter { name: n } if n == name);
            if !carried {
                let _ = write!(out, "  // {}", escape(name, false));
            }
        }
        out.push('\n');
    }
    out
}

/// The nodes of `g` in the order [`print()`] prints them.
fn print_order(g: &Graph) -> Vec<NodeId> {
    g.topo_order().unwrap_or_else(|_| g.node_ids())
}

/// The number [`print()`] gives each node of `g` (`%N`): its position in topological order,
/// not its id. Tools that name nodes next to a printed graph use these.
pub fn numbers(g: &Graph) -> HashMap<NodeId, usize> {
    print_order(g).into_iter().enumerate().map(|(i, id)| (id, i)).collect()
}

fn ints(v: &[usize]) -> String {
    let parts: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", parts.join(","))
}

fn floats(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
    format!("[{}]", parts.join(", "))
}

/// The `key=value` attributes of `op`, in printing order.
fn attributes(op: &Op) -> Vec<String> {
    match op {
        Op::Input { name } | Op::Parameter { name } => vec![format!("name=\"{}\"", escape(name, true))],
        Op::Constant { values } => vec![format!("values={}", floats(values))],
        Op::Full { value } => vec![format!("value={value:?}")],
        Op::Iota { axis } | Op::Concat { axis } | Op::Gather { axis } | Op::DynamicUpdateSlice { axis } => {
            vec![format!("axis={axis}")]
        }
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::MatMul => vec![],
        Op::Cast { to } => vec![format!("to={to}")],
        Op::Broadcast { shape, dims } => vec![format!("shape={}", ints(shape)), format!("dims={}", ints(dims))],
        Op::Reshape { shape } => vec![format!("shape={}", ints(shape))],
        Op::Transpose { perm } => vec![format!("perm={}", ints(perm))],
        Op::Slice { start, limit, stride } => {
            vec![format!("start={}", ints(start)), format!("limit={}", ints(limit)), format!("stride={}", ints(stride))]
        }
        Op::Pad { low, high, value } => {
            vec![format!("low={}", ints(low)), format!("high={}", ints(high)), format!("value={value:?}")]
        }
        Op::Reduce { kind, axes, keep_dims } => {
            vec![format!("kind={}", kind.name()), format!("axes={}", ints(axes)), format!("keep_dims={keep_dims}")]
        }
        Op::ArgMax { axis, keep_dims } => vec![format!("axis={axis}"), format!("keep_dims={keep_dims}")],
        Op::Conv2d { stride, padding, dilation, groups } => vec![
            format!("stride={}", ints(stride)),
            format!("padding={}", ints(padding)),
            format!("dilation={}", ints(dilation)),
            format!("groups={groups}"),
        ],
        Op::Pool { kind, window, stride, padding } => vec![
            format!("kind={}", kind.name()),
            format!("window={}", ints(window)),
            format!("stride={}", ints(stride)),
            format!("padding={}", ints(padding)),
        ],
    }
}

/// Escapes `\`, control characters and (inside quotes) `"`; outside quotes (the name
/// comment) also leading and trailing whitespace, so that the parser may trim the comment.
fn escape(s: &str, quoted: bool) -> String {
    let last = s.chars().count().saturating_sub(1);
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' if quoted => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() || (!quoted && c.is_whitespace() && (i == 0 || i == last)) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

/// Reverses [`escape`].
fn unescape(s: &str) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('u') => {
                let rest = chars.as_str();
                let hex = rest.strip_prefix('{').and_then(|r| r.split_once('}')).map(|(h, _)| h);
                let ch = hex.and_then(|h| u32::from_str_radix(h, 16).ok()).and_then(char::from_u32);
                match (hex, ch) {
                    (Some(h), Some(ch)) => {
                        out.push(ch);
                        chars = rest[h.len() + 2..].chars();
                    }
                    _ => return Err(format!("bad unicode escape in {s:?}")),
                }
            }
            other => {
                return Err(format!("unknown escape `\\{}` in {s:?}", other.map(String::from).unwrap_or_default()))
            }
        }
    }
    Ok(out)
}

/// Parses the text form back into a graph.
///
/// Leaves (input, parameter, constant, full, iota) take their type from the `: type` suffix;
/// every other node's type is inferred from its operands and must equal the printed one.
/// Node numbers need only be unique and defined before use. Empty lines and lines starting
/// with `//` are ignored; a [`Program`]'s `outputs` and `update` lines are checked and
/// dropped ([`parse_program`] keeps them). Every problem is an [`IrError::Parse`] naming the
/// 1-based line.
pub fn parse(text: &str) -> Result<Graph> {
    Ok(parse_program(text)?.graph)
}

/// A graph with the values a computation returns and the parameters it updates, as
/// [`print_program`] writes it and [`parse_program`] reads it.
#[derive(Clone, Debug)]
pub struct Program {
    /// The nodes.
    pub graph: Graph,
    /// The values returned, in order.
    pub outputs: Vec<NodeId>,
    /// Parameter updates: each parameter's name and the node holding its new value (written
    /// back to the parameter, not returned).
    pub updates: Vec<(String, NodeId)>,
}

impl Program {
    /// The outputs, then the updates' values: every value a run must leave behind (what a
    /// compile that writes the updates stores).
    pub fn kept(&self) -> Vec<NodeId> {
        self.outputs.iter().copied().chain(self.updates.iter().map(|(_, n)| *n)).collect()
    }
}

/// Prints `p`: its graph as [`print()`] does, then one `outputs(%a, %b, …)` line and one
/// `update(%n) {name="…"}` line per update, in order.
pub fn print_program(p: &Program) -> String {
    let mut out = print(&p.graph);
    let num = numbers(&p.graph);
    let list: Vec<String> = p.outputs.iter().map(|o| format!("%{}", num[o])).collect();
    let _ = writeln!(out, "outputs({})", list.join(", "));
    for (name, node) in &p.updates {
        let _ = writeln!(out, "update(%{}) {{name=\"{}\"}}", num[node], escape(name, true));
    }
    out
}

/// Parses a [`Program`]: the graph as [`parse`] reads it, then at most one `outputs` line and
/// any number of `update` lines, after every node. Without an `outputs` line the outputs are
/// the nodes nothing uses (updates' values excepted), in printing order. An update must name
/// a parameter of the graph, once, with a value of its type.
pub fn parse_program(text: &str) -> Result<Program> {
    let mut g = Graph::new();
    let mut ids: HashMap<usize, NodeId> = HashMap::new();
    let (mut outputs, mut updates): (Option<Vec<NodeId>>, Vec<(String, NodeId)>) = (None, Vec::new());
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with("//") {
            continue;
        }
        let line = if trimmed.starts_with('%') {
            if outputs.is_some() || !updates.is_empty() {
                Err("a node after the outputs or updates (they come last)".to_string())
            } else {
                parse_line(&mut g, &mut ids, raw)
            }
        } else {
            parse_tail_line(&g, &ids, raw, &mut outputs, &mut updates)
        };
        line.map_err(|detail| IrError::Parse { line: i + 1, detail })?;
    }
    let outputs = outputs.unwrap_or_else(|| {
        let updated: Vec<NodeId> = updates.iter().map(|(_, n)| *n).collect();
        print_order(&g).into_iter().filter(|&n| g.users(n).is_empty() && !updated.contains(&n)).collect()
    });
    Ok(Program { graph: g, outputs, updates })
}

/// An `outputs(…)` or `update(%n) {name="…"}` line.
fn parse_tail_line(
    g: &Graph,
    ids: &HashMap<usize, NodeId>,
    line: &str,
    outputs: &mut Option<Vec<NodeId>>,
    updates: &mut Vec<(String, NodeId)>,
) -> Result<(), String> {
    let mut c = Cursor { s: line, pos: 0 };
    let what = c.word("`%`, `outputs` or `update`")?;
    let is_outputs = match what.as_str() {
        "outputs" => true,
        "update" => false,
        other => return Err(format!("expected `%`, `outputs` or `update`, found `{other}`")),
    };
    c.expect('(')?;
    let nodes = c.nodes(ids, "a node", |n| format!("{what}: unknown node %{n}"))?;
    let mut attrs = if c.eat('{') { c.attrs()? } else { Attrs(Vec::new()) };
    c.skip_ws();
    if !c.rest().is_empty() {
        return Err(format!("unexpected {} after {what}", c.found()));
    }
    if is_outputs {
        attrs.finish("outputs")?;
        if outputs.is_some() {
            return Err("outputs given twice".into());
        }
        if !updates.is_empty() {
            return Err("outputs after an update (outputs come first)".into());
        }
        *outputs = Some(nodes);
        return Ok(());
    }
    let name = attrs.string("name")?;
    attrs.finish("update")?;
    let &[node] = nodes.as_slice() else {
        return Err(format!("update takes one value, got {}", nodes.len()));
    };
    let param = g
        .node_ids()
        .into_iter()
        .find(|&n| matches!(&g.node(n).op, Op::Parameter { name: p } if *p == name))
        .ok_or_else(|| format!("update of `{name}`, which no parameter is named"))?;
    if updates.iter().any(|(n, _)| *n == name) {
        return Err(format!("`{name}` updated twice"));
    }
    if g.ty(node) != g.ty(param) {
        return Err(format!("update of `{name}`: {} with a value of type {}", g.ty(param), g.ty(node)));
    }
    updates.push((name, node));
    Ok(())
}

fn parse_line(g: &mut Graph, ids: &mut HashMap<usize, NodeId>, line: &str) -> Result<(), String> {
    let mut c = Cursor { s: line, pos: 0 };
    c.expect('%')?;
    let def = c.number("a node number")?;
    if ids.contains_key(&def) {
        return Err(format!("%{def} is defined twice"));
    }
    c.expect('=')?;
    let mnemonic = c.word("an op name")?;
    c.expect('(')?;
    let operands = c.nodes(ids, "an operand", |n| format!("unknown operand %{n} (not defined on an earlier line)"))?;
    let mut attrs = if c.eat('{') { c.attrs()? } else { Attrs(Vec::new()) };
    c.expect(':')?;
    let ty = c.ty()?;
    c.skip_ws();
    let rest = c.rest();
    let name = match rest.strip_prefix("//") {
        Some(comment) => Some(unescape(comment.trim())?),
        None if rest.is_empty() => None,
        None => return Err(format!("unexpected {} after the type", c.found())),
    };
    let op = build_op(&mnemonic, &mut attrs)?;
    attrs.finish(&mnemonic)?;
    let id = if op.is_leaf() {
        if !operands.is_empty() {
            return Err(format!("{mnemonic} takes no operands, got {}", operands.len()));
        }
        g.add_leaf(op, ty).map_err(|e| e.to_string())?
    } else {
        let id = g.add_op(op, &operands).map_err(|e| e.to_string())?;
        if g.ty(id) != &ty {
            return Err(format!("{mnemonic}: printed type {ty} but the operands give {}", g.ty(id)));
        }
        id
    };
    if let Some(name) = name {
        g.set_name(id, name);
    }
    ids.insert(def, id);
    Ok(())
}

/// Builds the op named `mnemonic`, taking its fields from `attrs`.
fn build_op(mnemonic: &str, a: &mut Attrs) -> Result<Op, String> {
    if let Some(u) = UnaryOp::ALL.into_iter().find(|u| u.name() == mnemonic) {
        return Ok(Op::Unary(u));
    }
    if let Some(b) = BinaryOp::ALL.into_iter().find(|b| b.name() == mnemonic) {
        return Ok(Op::Binary(b));
    }
    Ok(match mnemonic {
        "input" => Op::Input { name: a.string("name")? },
        "parameter" => Op::Parameter { name: a.string("name")? },
        "constant" => Op::Constant { values: a.floats("values")? },
        "full" => Op::Full { value: a.float("value")? },
        "iota" => Op::Iota { axis: a.int("axis")? },
        "select" => Op::Select,
        "cast" => Op::Cast { to: a.word("to")?.parse::<DType>()? },
        "broadcast" => Op::Broadcast { shape: a.shape("shape")?, dims: a.ints("dims")? },
        "reshape" => Op::Reshape { shape: a.shape("shape")? },
        "transpose" => Op::Transpose { perm: a.ints("perm")? },
        "slice" => Op::Slice { start: a.ints("start")?, limit: a.ints("limit")?, stride: a.ints("stride")? },
        "concat" => Op::Concat { axis: a.int("axis")? },
        "pad" => Op::Pad { low: a.ints("low")?, high: a.ints("high")?, value: a.float("value")? },
        "gather" => Op::Gather { axis: a.int("axis")? },
        "dynamic_update_slice" => Op::DynamicUpdateSlice { axis: a.int("axis")? },
        "reduce" => {
            let kind = a.word("kind")?;
            let kind = ReduceKind::ALL
                .into_iter()
                .find(|k| k.name() == kind)
                .ok_or_else(|| format!("unknown reduce kind `{kind}` (expected sum, max, min or prod)"))?;
            Op::Reduce { kind, axes: a.ints("axes")?, keep_dims: a.bool("keep_dims")? }
        }
        "argmax" => Op::ArgMax { axis: a.int("axis")?, keep_dims: a.bool("keep_dims")? },
        "matmul" => Op::MatMul,
        "conv2d" => Op::Conv2d {
            stride: a.pair("stride")?,
            padding: a.pair("padding")?,
            dilation: a.pair("dilation")?,
            groups: a.int("groups")?,
        },
        "pool" => {
            let kind = match a.word("kind")?.as_str() {
                "max" => PoolKind::Max,
                "avg" => PoolKind::Avg,
                other => return Err(format!("unknown pool kind `{other}` (expected max or avg)")),
            };
            Op::Pool { kind, window: a.pair("window")?, stride: a.pair("stride")?, padding: a.pair("padding")? }
        }
        other => return Err(format!("unknown op `{other}`")),
    })
}

/// The form of an attribute value.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// A bare word: number, identifier or bool.
    Word,
    /// A quoted string.
    Str,
    /// A list of bare words in brackets.
    List,
}

/// The parsed attributes of one line (key, form, words), consumed field by field.
struct Attrs(Vec<(String, Kind, Vec<String>)>);

impl Attrs {
    fn take(&mut self, key: &str, kind: Kind) -> Result<Vec<String>, String> {
        let i = self.0.iter().position(|(k, ..)| k == key).ok_or_else(|| format!("missing attribute `{key}`"))?;
        let (_, found, words) = self.0.remove(i);
        if found != kind {
            let want = ["a bare word", "a quoted string", "a list `[...]`"][kind as usize];
            return Err(format!("attribute `{key}` must be {want}"));
        }
        Ok(words)
    }

    fn finish(&self, op: &str) -> Result<(), String> {
        match self.0.first() {
            Some((k, ..)) => Err(format!("{op} has no attribute `{k}`")),
            None => Ok(()),
        }
    }

    fn word(&mut self, key: &str) -> Result<String, String> {
        Ok(self.take(key, Kind::Word)?.pop().unwrap_or_default())
    }

    fn string(&mut self, key: &str) -> Result<String, String> {
        Ok(self.take(key, Kind::Str)?.pop().unwrap_or_default())
    }

    fn int(&mut self, key: &str) -> Result<usize, String> {
        to_int(&self.word(key)?, key)
    }

    fn float(&mut self, key: &str) -> Result<f64, String> {
        to_float(&self.word(key)?, key)
    }

    fn bool(&mut self, key: &str) -> Result<bool, String> {
        match self.word(key)?.as_str() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("attribute `{key}`: expected true or false, found `{other}`")),
        }
    }

    fn ints(&mut self, key: &str) -> Result<Vec<usize>, String> {
        self.take(key, Kind::List)?.iter().map(|w| to_int(w, key)).collect()
    }

    fn shape(&mut self, key: &str) -> Result<Vec<usize>, String> {
        let dims = self.ints(key)?;
        check_numel(&dims)?;
        Ok(dims)
    }

    fn floats(&mut self, key: &str) -> Result<Vec<f64>, String> {
        self.take(key, Kind::List)?.iter().map(|w| to_float(w, key)).collect()
    }

    fn pair(&mut self, key: &str) -> Result<[usize; 2], String> {
        let v = self.ints(key)?;
        <[usize; 2]>::try_from(v.as_slice()).map_err(|_| format!("attribute `{key}` needs 2 entries, got {}", v.len()))
    }
}

fn to_int(w: &str, what: &str) -> Result<usize, String> {
    match w.parse::<usize>() {
        Ok(n) if n <= MAX_INT => Ok(n),
        Ok(_) => Err(format!("{what}: {w} is too large (at most {MAX_INT})")),
        Err(_) => Err(format!("{what}: expected a non-negative integer, found `{w}`")),
    }
}

fn to_float(w: &str, what: &str) -> Result<f64, String> {
    w.parse::<f64>().map_err(|_| format!("{what}: expected a number, found `{w}`"))
}

fn check_numel(dims: &[usize]) -> Result<(), String> {
    match dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)) {
        Some(_) => Ok(()),
        None => Err(format!("shape {dims:?} has too many elements")),
    }
}

/// A position in one line.
struct Cursor<'a> {
    s: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.pos..]
    }

    fn skip_ws(&mut self) {
        let rest = self.rest();
        self.pos += rest.len() - rest.trim_start().len();
    }

    /// Describes what comes next, for error messages.
    fn found(&self) -> String {
        match self.rest() {
            "" => "the end of the line".into(),
            rest => format!("`{}`", rest.chars().take(16).collect::<String>()),
        }
    }

    /// Skips whitespace, then consumes `c` if it comes next.
    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        if self.rest().starts_with(c) {
            self.pos += c.len_utf8();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected `{c}`, found {}", self.found()))
        }
    }

    /// Skips whitespace, then consumes a non-empty run of word characters: ASCII letters and
    /// digits, `_`, `.`, `+`, `-`.
    fn word(&mut self, what: &str) -> Result<String, String> {
        self.skip_ws();
        let rest = self.rest();
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "_.+-".contains(c))).unwrap_or(rest.len());
        if len == 0 {
            return Err(format!("expected {what}, found {}", self.found()));
        }
        self.pos += len;
        Ok(rest[..len].to_string())
    }

    fn number(&mut self, what: &str) -> Result<usize, String> {
        let w = self.word(what)?;
        w.parse::<usize>().map_err(|_| format!("{what}: expected a non-negative integer, found `{w}`"))
    }

    /// Items separated by `,` up to `close` (after the opening bracket); may be empty.
    fn seq<T>(&mut self, close: char, mut item: impl FnMut(&mut Self) -> Result<T, String>) -> Result<Vec<T>, String> {
        let mut items = Vec::new();
        if self.eat(close) {
            return Ok(items);
        }
        loop {
            items.push(item(self)?);
            if self.eat(close) {
                return Ok(items);
            }
            self.expect(',')?;
        }
    }

    /// `%a, %b, …)` after the opening `(`: nodes defined on earlier lines (`ids`); `what`
    /// names a number in errors, `unknown` words the error for an undefined one.
    fn nodes(
        &mut self,
        ids: &HashMap<usize, NodeId>,
        what: &str,
        unknown: impl Fn(usize) -> String,
    ) -> Result<Vec<NodeId>, String> {
        self.seq(')', |c| {
            c.expect('%')?;
            let n = c.number(what)?;
            ids.get(&n).copied().ok_or_else(|| unknown(n))
        })
    }

    /// A quoted string, after its opening `"`.
    fn string(&mut self) -> Result<String, String> {
        let rest = self.rest();
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    self.pos += i + 1;
                    return unescape(&rest[..i]);
                }
                _ => {}
            }
        }
        Err("unterminated string".into())
    }

    /// `key=value, …}` after the opening `{`.
    fn attrs(&mut self) -> Result<Attrs, String> {
        let mut attrs = Attrs(Vec::new());
        self.seq('}', |c| {
            let key = c.word("an attribute name")?;
            c.expect('=')?;
            let (kind, words) = if c.eat('"') {
                (Kind::Str, vec![c.string()?])
            } else if c.eat('[') {
                (Kind::List, c.seq(']', |c| c.word("a list item"))?)
            } else {
                (Kind::Word, vec![c.word("a value")?])
            };
            if attrs.0.iter().any(|(k, ..)| *k == key) {
                return Err(format!("attribute `{key}` given twice"));
            }
            attrs.0.push((key, kind, words));
            Ok(())
        })?;
        Ok(attrs)
    }

    /// A tensor type such as `f32[2,3]` or `bool[]`.
    fn ty(&mut self) -> Result<TensorType, String> {
        let dtype = self.word("a type")?.parse::<DType>()?;
        self.expect('[')?;
        let dims = self.seq(']', |c| to_int(&c.word("a dimension")?, "dimension"))?;
        check_numel(&dims)?;
        Ok(TensorType::new(dtype, dims))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{verify, GraphBuilder, Tensor};
    use std::collections::BTreeSet;

    fn round_trip(g: &Graph) -> String {
        let text = print(g);
        let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        verify(&back).unwrap();
        assert_eq!(print(&back), text);
        assert_eq!(back.len(), g.len());
        text
    }

    fn parse_err(text: &str) -> (usize, String) {
        match parse_program(text) {
            Err(IrError::Parse { line, detail }) => (line, detail),
            other => panic!("expected a parse error for {text:?}, got {other:?}"),
        }
    }

    /// A graph that uses every op variant, every reduce and pool kind, and odd values.
    fn every_op() -> (Graph, String) {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 3]).unwrap();
        let w = b.parameter("w \"weights\"\n", DType::F32, [3, 4]).unwrap();
        let c = b.constant(DType::F32, [3], &[1.0, 2.5, -3.0]).unwrap();
        let odd =
            b.constant(DType::F32, [6], &[f64::INFINITY, f64::NEG_INFINITY, f64::NAN, -0.0, 1e-300, 0.1]).unwrap();
        let f = b.full(DType::F32, [2, 3], 0.5).unwrap().named("half");
        let io = b.iota(DType::I32, [2, 3], 1).unwrap();
        let s = b.scalar(DType::F16, f64::NAN).unwrap().named("  spaced // \\ \"name\"\t");
        let mut outs: Vec<Tensor> = vec![odd.reshape([2, 3]).unwrap(), s.cast(DType::U32).unwrap()];
        for u in UnaryOp::ALL {
            let operand = if u == UnaryOp::Not { x.lt(&f).unwrap() } else { x.clone() };
            outs.push(operand.unary(u).unwrap());
        }
        let (p, q) = (x.gt(&f).unwrap(), x.le(&f).unwrap());
        for op in BinaryOp::ALL {
            let (l, r) = if matches!(op, BinaryOp::And | BinaryOp::Or) { (&p, &q) } else { (&x, &f) };
            outs.push(l.binary(op, r).unwrap());
        }
        outs.push(p.select(&x, &f).unwrap());
        outs.push(x.cast(DType::F16).unwrap().named("half precision"));
        outs.push(c.broadcast_to([2, 3]).unwrap());
        outs.push(c.broadcast_in_dim(vec![3, 5], vec![0]).unwrap());
        outs.push(x.reshape([3, 2]).unwrap());
        outs.push(x.transpose(&[1, 0]).unwrap());
        outs.push(x.slice(&[0, 1], &[2, 3], &[1, 2]).unwrap());
        outs.push(b.concat(&[&x, &f, &x], 0).unwrap());
        outs.push(x.pad(&[1, 0], &[0, 2], f64::NEG_INFINITY).unwrap());
        outs.push(w.gather(&io, 0).unwrap());
        for kind in ReduceKind::ALL {
            outs.push(x.reduce(kind, &[1], false).unwrap());
            outs.push(x.reduce(kind, &[0, 1], true).unwrap());
        }
        outs.push(x.argmax(1, true).unwrap());
        outs.push(x.argmax(0, false).unwrap());
        outs.push(x.matmul(&w).unwrap());
        let img = b.input("img", DType::F32, [1, 4, 8, 8]).unwrap();
        let k = b.parameter("k", DType::F32, [6, 2, 3, 3]).unwrap();
        let conv = img.conv2d(&k, [2, 1], [1, 0], [1, 2], 2).unwrap();
        outs.push(conv.max_pool2d([2, 2], [2, 2], [1, 0]).unwrap());
        outs.push(img.avg_pool2d([3, 3], [1, 2], [1, 1]).unwrap());
        let g = b.graph();
        let mut names: BTreeSet<&str> = g.node_ids().iter().map(|&id| g.node(id).op.name()).collect();
        let fixed = ["input", "parameter", "constant", "full", "iota", "select", "cast", "broadcast", "reshape"];
        let more = ["transpose", "slice", "concat", "pad", "gather", "reduce", "argmax", "matmul", "conv2d", "pool"];
        for n in fixed.iter().chain(&more).copied() {
            assert!(names.remove(n), "op {n} not covered");
        }
        let elementwise: BTreeSet<&str> =
            UnaryOp::ALL.iter().map(|u| u.name()).chain(BinaryOp::ALL.iter().map(|b| b.name())).collect();
        assert_eq!(names, elementwise);
        (g, print(&b.graph()))
    }

    #[test]
    fn every_op_round_trips() {
        let (g, text) = every_op();
        assert_eq!(round_trip(&g), text);
        for needle in [
            "kind=sum",
            "kind=max",
            "kind=min",
            "kind=prod",
            "pool(",
            "kind=avg",
            "values=[inf, -inf, NaN, -0.0, 1e-300, 0.1]",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        assert!(text.contains(r#"{name="w \"weights\"\n"}"#), "{text}");
        assert!(text.contains(r#"  // \u{20} spaced // \\ "name"\t"#), "{text}");
        assert!(text.contains(": f16[]"), "{text}");
    }

    #[test]
    fn exact_text() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 3]).unwrap();
        x.exp().unwrap().named("e").sum(&[1], false).unwrap();
        let expected = "%0 = input() {name=\"x\"} : f32[2,3]\n\
                        %1 = exp(%0) : f32[2,3]  // e\n\
                        %2 = reduce(%1) {kind=sum, axes=[1], keep_dims=false} : f32[2]\n";
        assert_eq!(print(&b.graph()), expected);
        assert_eq!(round_trip(&b.graph()), expected);
    }

    #[test]
    fn printing_ignores_internal_indices() {
        let mut g = Graph::new();
        let junk = g.add_leaf(Op::Full { value: 1.0 }, TensorType::new(DType::F32, [2])).unwrap();
        let y = g.add_leaf(Op::Input { name: "y".into() }, TensorType::new(DType::F32, [2])).unwrap();
        let x = g.add_leaf(Op::Input { name: "x".into() }, TensorType::new(DType::F32, [2])).unwrap();
        g.remove(junk);
        g.add_op(Op::Binary(BinaryOp::Sub), &[x, y]).unwrap();
        let text = round_trip(&g);
        assert_eq!(
            text,
            "%0 = input() {name=\"y\"} : f32[2]\n%1 = input() {name=\"x\"} : f32[2]\n%2 = sub(%1, %0) : f32[2]\n"
        );
    }

    #[test]
    fn parses_comments_blank_lines_and_loose_spacing() {
        let text = "// a comment\n\n  %7=input(){ name = \"a\" }:f32[ 2 ]\n%3 = neg( %7 ) : f32[2] //  n  \n%9 = add(%3,%7) {} : f32[2]\r\n";
        let g = parse(text).unwrap();
        assert_eq!(
            print(&g),
            "%0 = input() {name=\"a\"} : f32[2]\n%1 = neg(%0) : f32[2]  // n\n%2 = add(%1, %0) : f32[2]\n"
        );
    }

    #[test]
    fn parse_errors_name_the_line() {
        let x = "%0 = input() {name=\"x\"} : f32[2,3]\n";
        let cases = [
            (format!("{x}%1 = frobnicate(%0) : f32[2,3]"), 2, "unknown op"),
            (format!("{x}\n%1 = exp(%7) : f32[2,3]"), 3, "unknown operand %7"),
            (format!("{x}%1 = exp(%1) : f32[2,3]"), 2, "unknown operand %1"),
            (format!("{x}%1 = exp(%0) : f32[3,2]"), 2, "printed type"),
            (format!("{x}%1 = reduce(%0) {{kind=sum, axes=[1]}} : f32[2]"), 2, "missing attribute `keep_dims`"),
            (format!("{x}%1 = transpose(%0) {{perm=[1,0], foo=1}} : f32[3,2]"), 2, "no attribute `foo`"),
            (format!("{x}%1 = transpose(%0) {{perm=[1,0], perm=[1,0]}} : f32[3,2]"), 2, "given twice"),
            (format!("{x}%1 = transpose(%0) {{perm=1}} : f32[3,2]"), 2, "must be a list"),
            (format!("{x}%1 = reduce(%0) {{kind=avg, axes=[1], keep_dims=false}} : f32[2]"), 2, "unknown reduce kind"),
            (format!("{x}%1 = cast(%0) {{to=f64}} : f64[2,3]"), 2, "unknown dtype"),
            (format!("{x}%1 = add(%0) : f32[2,3]"), 2, "expects 2 operand"),
            (format!("{x}%0 = exp(%0) : f32[2,3]"), 2, "defined twice"),
            (format!("{x}%1 = exp(%0) : f32[2,3] trailing"), 2, "unexpected"),
            ("%0 = input(%0) {name=\"x\"} : f32[2]".to_string(), 1, "unknown operand"),
            ("%0 = constant() {values=[1.0]} : f32[2]".to_string(), 1, "1 values given"),
            ("%0 = input() {name=\"x\\q\"} : f32[2]".to_string(), 1, "unknown escape"),
            ("%0 = input() {name=\"x} : f32[2]".to_string(), 1, "unterminated string"),
            ("%0 = full() {value=1.0} : f32[99999999999]".to_string(), 1, "too large"),
            ("%0 = full() {value=1.0} : f32[4294967295,4294967295,4294967295]".to_string(), 1, "too many elements"),
            ("hello world".to_string(), 1, "expected `%`"),
        ];
        for (text, line, needle) in cases {
            let (l, detail) = parse_err(&text);
            assert_eq!(l, line, "{text}: {detail}");
            assert!(detail.contains(needle), "{text}: {detail:?} lacks {needle:?}");
        }
        let zero_window = "%0 = input() {name=\"x\"} : f32[1,1,4,4]\n\
                           %1 = pool(%0) {kind=max, window=[0,0], stride=[1,1], padding=[0,0]} : f32[1,1,4,4]";
        assert_eq!(parse_err(zero_window).0, 2);
    }

    /// `%2 = x · w`, its sum `%3` and an update of `w` to `%4 = w − %2`.
    fn program() -> Program {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 2]).unwrap();
        let w = b.parameter("w \"1\"", DType::F32, [2, 2]).unwrap();
        let y = x.matmul(&w).unwrap();
        let loss = y.sum(&[0, 1], false).unwrap();
        let step = w.sub(&y).unwrap();
        Program { graph: b.graph(), outputs: vec![loss.id(), y.id()], updates: vec![("w \"1\"".into(), step.id())] }
    }

    #[test]
    fn programs_round_trip_with_outputs_and_updates() {
        let p = program();
        let text = print_program(&p);
        assert!(text.ends_with("outputs(%3, %2)\nupdate(%4) {name=\"w \\\"1\\\"\"}\n"), "{text}");
        let back = parse_program(&text).unwrap();
        assert_eq!(print_program(&back), text);
        let num = numbers(&back.graph);
        assert_eq!(back.outputs.iter().map(|o| num[o]).collect::<Vec<_>>(), [3, 2]);
        assert_eq!(back.updates.iter().map(|(n, v)| (n.as_str(), num[v])).collect::<Vec<_>>(), [("w \"1\"", 4)]);
        assert_eq!(back.kept().len(), 3);
        // `parse` reads the same text as a graph.
        assert_eq!(print(&parse(&text).unwrap()), print(&p.graph));
    }

    #[test]
    fn outputs_default_to_the_nodes_nothing_uses() {
        let p = program();
        let graph_only = parse_program(&print(&p.graph)).unwrap();
        let num = numbers(&graph_only.graph);
        assert_eq!(graph_only.outputs.iter().map(|o| num[o]).collect::<Vec<_>>(), [3, 4]);
        // An update's value is written back, not returned.
        let mut text = print(&p.graph);
        text.push_str("update(%4) {name=\"w \\\"1\\\"\"}\n");
        let updating = parse_program(&text).unwrap();
        assert_eq!(updating.outputs.iter().map(|o| num[o]).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn program_errors_name_the_line() {
        let g = print(&program().graph);
        let cases = [
            (format!("{g}outputs(%9)"), 6, "unknown node %9"),
            (format!("{g}outputs(%3)\noutputs(%2)"), 7, "outputs given twice"),
            (format!("{g}outputs(%3)\n%5 = neg(%3) : f32[]"), 7, "a node after the outputs"),
            (format!("{g}update(%4) {{name=\"v\"}}"), 6, "which no parameter is named"),
            (format!("{g}update(%3) {{name=\"w \\\"1\\\"\"}}"), 6, "with a value of type f32[]"),
            (format!("{g}update(%4, %2) {{name=\"w \\\"1\\\"\"}}"), 6, "one value, got 2"),
            (format!("{g}update(%4)"), 6, "missing attribute `name`"),
            (
                format!("{g}update(%4) {{name=\"w \\\"1\\\"\"}}\nupdate(%2) {{name=\"w \\\"1\\\"\"}}"),
                7,
                "updated twice",
            ),
            (format!("{g}update(%4) {{name=\"w \\\"1\\\"\"}}\noutputs(%3)"), 7, "outputs after an update"),
            (format!("{g}outputs(%3) {{x=1}}"), 6, "no attribute `x`"),
            (format!("{g}outputs(%3) extra"), 6, "unexpected"),
            (format!("{g}returns(%4)"), 6, "expected `%`, `outputs` or `update`, found `returns`"),
        ];
        for (text, line, needle) in cases {
            let (l, detail) = parse_err(&text);
            assert_eq!(l, line, "{text}: {detail}");
            assert!(detail.contains(needle), "{text}: {detail:?} lacks {needle:?}");
        }
    }

    #[test]
    fn never_panics_on_mangled_text() {
        // Every op, then a program's outputs and update lines.
        let (_, ops) = every_op();
        let text =
            ops + print_program(&program()).lines().skip(5).map(|l| format!("{l}\n")).collect::<String>().as_str();
        let lines: Vec<&str> = text.lines().collect();
        let mut seen = BTreeSet::new();
        for (i, line) in lines.iter().enumerate() {
            // One line per op mnemonic (or tail line) is enough to reach every parsing path.
            let kind = if line.starts_with('%') { line.split(['(', '=']).nth(1) } else { line.split('(').next() };
            if !seen.insert(kind.unwrap_or_default().trim()) {
                continue;
            }
            let prefix: String = lines[..i].iter().map(|l| format!("{l}\n")).collect();
            for (cut, ch) in line.char_indices() {
                let (head, tail) = (&line[..cut], &line[cut + ch.len_utf8()..]);
                let _ = parse_program(&format!("{prefix}{head}"));
                for junk in ["", "%", "]", "\"", "\\", "\u{e9}"] {
                    let _ = parse_program(&format!("{prefix}{head}{junk}{tail}"));
                }
            }
        }
    }
}
