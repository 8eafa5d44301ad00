//! The fusion pass's decisions on one producer at a time: what fusing it costs and saves,
//! and the peak of live bytes the kernels would have.

use super::*;

impl Ctx<'_> {
    /// The peak of live bytes of the kernels `groups` form, run in [`Ctx::order`]: what
    /// [`liveness::intervals`] and [`liveness::peak_live_bytes`] give for those kernels. This
    /// runs once per memory-relevant decision: the summaries of changed groups are brought up
    /// to date and their live ranges moved in [`LivePeak`]; only where that cannot place the
    /// kernels (two share a root, or the grouping is not valid) is the plan swept
    /// ([`Ctx::swept_peak`]).
    pub(super) fn peak(&self, groups: &Groups) -> u64 {
        let mut cache = groups.summaries.borrow_mut();
        let mut changed = std::mem::take(&mut *groups.changed.borrow_mut());
        let stale = std::mem::take(&mut *groups.stale.borrow_mut());
        let mut is_stale = groups.is_stale.borrow_mut();
        for x in stale {
            is_stale[x.index()] = false;
            // The groups computing `x` now; one without a summary (forgotten since it
            // changed) needs nothing.
            for k in groups.of(x) {
                let Some(sum) = cache[k].as_mut() else { continue };
                match (sum.outputs.binary_search(&x), self.stored(x, groups)) {
                    (Ok(at), false) => {
                        sum.outputs.remove(at);
                        changed.push(k);
                    }
                    (Err(at), true) => {
                        sum.outputs.insert(at, x);
                        changed.push(k);
                    }
                    _ => {}
                }
            }
        }
        changed.sort_unstable();
        changed.dedup();
        let mut live = groups.live.borrow_mut();
        for gi in changed {
            let gr = &groups.sets[gi];
            if !gr.is_empty() && cache[gi].is_none() {
                cache[gi] = Some(self.summary(gr, groups));
            }
            live.set(gi, cache[gi].as_ref().filter(|_| !gr.is_empty()));
        }
        match live.peak(&self.info) {
            Some(peak) => {
                debug_assert_eq!(peak, self.swept_peak(&cache), "incremental and swept peaks differ");
                peak
            }
            None => self.swept_peak(&cache),
        }
    }

    /// The peak of live bytes of kernels `cache` (`None`: an empty group), run in
    /// [`Ctx::order`], by a sweep over the whole plan.
    pub(super) fn swept_peak(&self, cache: &[Option<Summary>]) -> u64 {
        let ks: Vec<&Summary> = cache.iter().flatten().collect();
        let order = self.order(&ks);
        let last = order.len().saturating_sub(1);
        const UNSEEN: usize = usize::MAX;
        let mut start = vec![UNSEEN; self.index_bound];
        let mut end = vec![0; self.index_bound];
        let mut values = Vec::new();
        // Parameter updates stored by a kernel that reduces (see `ValueInfo::update`).
        let mut out_of_place = BTreeSet::new();
        for (step, &k) in order.iter().enumerate() {
            for o in &ks[k].outputs {
                if start[o.index()] == UNSEEN {
                    (start[o.index()], end[o.index()]) = (step, step);
                    values.push(*o);
                }
                if ks[k].reduces && self.info[o.index()].update {
                    out_of_place.insert(*o);
                }
            }
            for i in ks[k].inputs.iter().filter(|i| self.info[i.index()].arena) {
                if start[i.index()] == UNSEEN {
                    (start[i.index()], end[i.index()]) = (0, step);
                    values.push(*i);
                }
                end[i.index()] = end[i.index()].max(step);
            }
        }
        for o in self.outputs.iter().filter(|o| self.info[o.index()].arena) {
            if start[o.index()] == UNSEEN {
                start[o.index()] = 0;
                values.push(*o);
            }
            end[o.index()] = last;
        }
        let mut delta = vec![0i64; order.len() + 2];
        for v in values.into_iter().filter(|v| self.info[v.index()].counted || out_of_place.contains(v)) {
            let bytes = self.info[v.index()].bytes as i64;
            delta[start[v.index()]] += bytes;
            delta[end[v.index()] + 1] -= bytes;
        }
        let (mut cur, mut peak) = (0i64, 0i64);
        for d in delta {
            cur += d;
            peak = peak.max(cur);
        }
        peak as u64
    }

    pub(super) fn summary(&self, gr: &BTreeSet<NodeId>, groups: &Groups) -> Summary {
        let root = gr.iter().map(|m| self.model_pos[m.index()]).max().unwrap_or(0);
        let mut members: Vec<NodeId> = gr.iter().copied().collect();
        members.sort_by_key(|n| self.pos(*n));
        let mut inputs = Vec::new();
        let mut seen = BTreeSet::new();
        for &m in &members {
            for &o in self.operands(m) {
                if !gr.contains(&o) && seen.insert(o) {
                    inputs.push(o);
                }
            }
        }
        let reduces = members.iter().any(|&m| self.g.node(m).op.reduced_axes().is_some());
        Summary { root, outputs: self.group_outputs(gr, groups), inputs, reduces }
    }

    /// `n`'s position in graph order ([`usize::MAX`] if it is not reachable).
    pub(super) fn pos(&self, n: NodeId) -> usize {
        self.pos.get(n.index()).copied().unwrap_or(usize::MAX)
    }

    pub(super) fn users(&self, id: NodeId) -> Vec<NodeId> {
        self.users.get(id.index()).cloned().unwrap_or_default()
    }

    /// Storage bindings of a kernel of `members` storing `outs`: its inputs plus outputs.
    pub(super) fn bindings(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> usize {
        self.inputs(members).collect::<BTreeSet<_>>().len() + outs.len()
    }

    /// What a kernel of `members` reads: the operands of members that are not members, in
    /// member order, repeats included.
    pub(super) fn inputs<'s>(&'s self, members: &'s BTreeSet<NodeId>) -> impl Iterator<Item = NodeId> + 's {
        members.iter().flat_map(|&m| self.operands(m).iter().copied()).filter(|o| !members.contains(o))
    }

    /// The root of a kernel of `members`: the member last in graph order.
    pub(super) fn root(&self, members: &BTreeSet<NodeId>) -> Option<NodeId> {
        members.iter().copied().max_by_key(|&m| self.pos(m))
    }

    pub(super) fn operands(&self, id: NodeId) -> &[NodeId] {
        self.operands.get(id.index()).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The members a kernel of `members` stores, in node order.
    pub(super) fn group_outputs(&self, members: &BTreeSet<NodeId>, groups: &Groups) -> Vec<NodeId> {
        members.iter().copied().filter(|&m| self.stored(m, groups)).collect()
    }

    /// Whether a kernel computing `m` stores it: `m` is a graph output, or some user of it is
    /// computed by a kernel that does not compute `m` (see [`Ctx::reads_stored`]). That user
    /// may be a member too, duplicated into the other kernel (where a producer fuses into all
    /// its consumers' kernels this does not happen, but `pull_exclusive_operands` can make it
    /// happen: a kernel computing `exp(t)` and `exp(t) + a` stores `exp(t)` when another
    /// kernel computing `exp(t) + a` reads it from memory).
    pub(super) fn stored(&self, m: NodeId, groups: &Groups) -> bool {
        self.output_set.contains(&m) || !self.users_needing_stored(m, groups).is_empty()
    }

    /// Whether user `u` of `m` is computed in some kernel that does not compute `m` itself
    /// (and so reads it from memory).
    pub(super) fn reads_stored(&self, u: NodeId, m: NodeId, groups: &Groups) -> bool {
        groups.of(u).any(|gi| !groups.computes(gi, m))
    }

    /// The users of `m` that read it from memory ([`Ctx::reads_stored`]): a kernel computing
    /// `m` stores it where one of them is outside it. Cached in [`Groups::needing`] (a value
    /// duplicated into hundreds of kernels, such as a step size every optimizer update
    /// computes, would otherwise have all its users checked per question).
    pub(super) fn users_needing_stored<'g>(&self, m: NodeId, groups: &'g Groups) -> std::cell::RefMut<'g, [NodeId]> {
        let cache = groups.needing.borrow_mut();
        std::cell::RefMut::map(cache, |c| {
            c[m.index()]
                .get_or_insert_with(|| {
                    let users = self.users.get(m.index()).into_iter().flatten();
                    users.copied().filter(|&u| self.reads_stored(u, m, groups)).collect()
                })
                .as_mut_slice()
        })
    }

    /// Evaluations per element of each member in a loop kernel whose stored members are
    /// `outs`, matching the code generator: each output's region (same-index chain) is
    /// computed once per element into registers; everything else is a function call per use.
    pub(super) fn multiplicity(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> BTreeMap<NodeId, f64> {
        // Members by dense index (their place in `list`), through a scratch array by node
        // index: a merged optimizer kernel has thousands of members, asked about per merge.
        let list: Vec<NodeId> = members.iter().copied().collect();
        let mut local = self.scratch.borrow_mut();
        for (i, &m) in list.iter().enumerate() {
            local[m.index()] = i as u32;
        }
        let at = |n: NodeId| -> Option<usize> { Some(local[n.index()]).filter(|&i| i != u32::MAX).map(|i| i as usize) };
        // Lets: the regions (same-index chains from each output, see `kernel::regions`) each
        // member is in; a region computes each of its members once per element.
        let mut lets = vec![0.0f64; list.len()];
        let mut seen = vec![usize::MAX; list.len()];
        for (r, &o) in outs.iter().enumerate() {
            let Some(oi) = at(o) else { continue };
            seen[oi] = r;
            let mut stack = vec![o];
            while let Some(n) = stack.pop() {
                lets[at(n).expect("a member")] += 1.0;
                for q in same_index_operands(self.g, n) {
                    if let Some(qi) = at(q) {
                        if seen[qi] != r {
                            seen[qi] = r;
                            stack.push(q);
                        }
                    }
                }
            }
        }
        // Calls: everything else is a function call per use, users before their operands.
        let mut order: Vec<usize> = (0..list.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(self.pos(list[i])));
        let mut calls = vec![0.0f64; list.len()];
        for &ni in &order {
            let n = list[ni];
            let mut total = 0.0;
            for &u in &self.users[n.index()] {
                let Some(ui) = at(u) else { continue };
                // A let of `u` reads `n` from registers when both share a region, which they
                // do wherever `u` reads it at the same index (a region holds the same-index
                // operands of its members); otherwise each let of `u` reads it by a call.
                let same = same_index_operands(self.g, u).contains(&n);
                let let_reads = if same { 0.0 } else { lets[ui] };
                for (p, &o) in self.operands(u).iter().enumerate() {
                    if o == n {
                        total += (let_reads + calls[ui]) * reads_per_operand_element(self.g, u, p);
                    }
                }
            }
            calls[ni] = total;
        }
        for &m in &list {
            local[m.index()] = u32::MAX;
        }
        list.iter().enumerate().map(|(i, &n)| (n, lets[i] + calls[i])).collect()
    }

    /// Whether a contraction (matmul, conv, pooling) in the group has arithmetic in its
    /// prologue: its operands are read many times per element, so only data movement (cast,
    /// transpose, broadcast, …) may be recomputed there.
    pub(super) fn arithmetic_prologue(&self, members: &BTreeSet<NodeId>) -> bool {
        members.iter().any(|&c| {
            matches!(self.g.node(c).op, Op::MatMul | Op::Conv2d { .. } | Op::Pool { .. })
                && self
                    .g
                    .operands(c)
                    .iter()
                    .any(|&o| self.upstream_or_self(members, o, &|n| !is_data_movement(&self.g.node(n).op)))
        })
    }

    pub(super) fn upstream_or_self(
        &self,
        members: &BTreeSet<NodeId>,
        from: NodeId,
        pred: &dyn Fn(NodeId) -> bool,
    ) -> bool {
        let mut stack = vec![from];
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if pred(n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// Members that depend, inside the group, on `roots`.
    pub(super) fn dependents(&self, members: &BTreeSet<NodeId>, roots: &BTreeSet<NodeId>) -> BTreeSet<NodeId> {
        let mut order: Vec<NodeId> = members.iter().copied().collect();
        order.sort_by_key(|n| self.pos(*n));
        let mut dep: BTreeSet<NodeId> = BTreeSet::new();
        for n in order {
            if self.operands(n).iter().any(|o| roots.contains(o) || dep.contains(o)) {
                dep.insert(n);
            }
        }
        dep
    }

    /// Whether `members`, storing `outs`, are sibling products for the matrix–vector kernel
    /// ([`FusionOptions::gemv`]): every contraction a matmul of at most
    /// [`GEMV_MAX_ROWS`] rows whose left operand is, below reshapes and casts, one node; no
    /// reduction; one output per product, each depending on exactly one of them.
    pub(super) fn sibling_products(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> bool {
        let g = self.g;
        let mut products = Vec::new();
        for &m in members {
            match g.node(m).op {
                Op::MatMul => products.push(m),
                Op::Conv2d { .. } | Op::Reduce { .. } => return false,
                _ => {}
            }
        }
        if products.len() < 2 || products.len() != outs.len() {
            return false;
        }
        let source = |mut n: NodeId| {
            while matches!(g.node(n).op, Op::Reshape { .. } | Op::Cast { .. }) {
                n = g.operands(n)[0];
            }
            n
        };
        let lhs = source(g.operands(products[0])[0]);
        let few_rows = |p: NodeId| {
            let d = g.ty(p).shape.dims();
            d.len() >= 2 && d[d.len() - 2] <= GEMV_MAX_ROWS
        };
        if !products.iter().all(|&p| few_rows(p) && source(g.operands(p)[0]) == lhs) {
            return false;
        }
        let mut taken = BTreeSet::new();
        let after: Vec<BTreeSet<NodeId>> =
            products.iter().map(|&p| self.dependents(members, &BTreeSet::from([p]))).collect();
        outs.iter().all(|&o| {
            let mut of = products.iter().zip(&after).filter(|(&p, deps)| p == o || deps.contains(&o)).map(|(&p, _)| p);
            match (of.next(), of.next()) {
                (Some(p), None) => taken.insert(p),
                _ => false,
            }
        })
    }

    /// Whether `members`, storing `outs`, are paired products for the matrix–vector kernel
    /// ([`FusionOptions::gemv`]): one output whose same-index region holds two or more
    /// matmuls of one left operand and one shape, of at most [`GEMV_MAX_ROWS`] rows (a gate
    /// and an up projection, `silu(x·Wg) · (x·Wu)`), their weights read alike (one layout and
    /// stored type), which the kernel accumulates side by side and combines in its epilogue.
    pub(super) fn paired_products(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> bool {
        let g = self.g;
        let [o] = outs else { return false };
        let products: Vec<NodeId> = members.iter().copied().filter(|&n| matches!(g.node(n).op, Op::MatMul)).collect();
        if products.len() < 2 || members.iter().any(|&n| matches!(g.node(n).op, Op::Conv2d { .. } | Op::Reduce { .. }))
        {
            return false;
        }
        let (lhs, dims) = (self.operands(products[0])[0], g.ty(products[0]).shape.dims());
        let same = products.iter().all(|&p| self.operands(p)[0] == lhs && g.ty(p).shape.dims() == dims);
        if !same
            || dims.len() < 2
            || dims[dims.len() - 2] > GEMV_MAX_ROWS
            || g.ty(*o).shape.numel() != g.ty(products[0]).shape.numel()
        {
            return false;
        }
        // The kernel walks paired weights in one loop: each read alike (one stored type and
        // layout below its casts and transposes, one shape).
        let read = |p: NodeId| {
            let (mut n, mut perms) = (self.operands(p)[1], Vec::new());
            while let Op::Cast { .. } | Op::Transpose { .. } = &g.node(n).op {
                if let Op::Transpose { perm } = &g.node(n).op {
                    perms.push(perm.clone());
                }
                n = self.operands(n)[0];
            }
            (g.ty(n).dtype, perms, &g.ty(self.operands(p)[1]).shape)
        };
        if products.iter().any(|&p| read(p) != read(products[0])) {
            return false;
        }
        let mut region = BTreeSet::from([*o]);
        let mut stack = vec![*o];
        while let Some(n) = stack.pop() {
            for q in same_index_operands(g, n) {
                if members.contains(&q) && region.insert(q) {
                    stack.push(q);
                }
            }
        }
        products.iter().all(|p| region.contains(p))
    }

    /// Whether `members`, storing `outs`, are products for the matrix–vector kernel
    /// ([`FusionOptions::gemv`]) with a row prologue ([`row_prologue`]): a layer norm's
    /// rows computed in the kernel, one row kernel's worth ([`Ctx::row_kind`]); the rest one
    /// product, or sibling products, as a loop kernel.
    pub(super) fn gemv_row_prologue(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> bool {
        if !members.iter().any(|&n| matches!(self.g.node(n).op, Op::Reduce { .. })) {
            return false;
        }
        let mut list: Vec<NodeId> = members.iter().copied().collect();
        list.sort_by_key(|&n| self.pos(n));
        let Some(p) = row_prologue(self.g, &list, outs, self.opts.gemv_stage_bytes) else { return false };
        let reduces: BTreeSet<NodeId> = p.reduces.iter().copied().collect();
        // What a row kernel would compute: the rows' value and what it is computed from, not
        // the reshapes and casts from it to the products' left operands.
        let mut rows = BTreeSet::new();
        let mut stack = vec![p.rows_of];
        while let Some(n) = stack.pop() {
            if p.members.contains(&n) && rows.insert(n) {
                stack.extend_from_slice(self.operands(n));
            }
        }
        let row = self.row_kind(&rows, &[p.rows_of], &reduces);
        let rest: BTreeSet<NodeId> = members.difference(&p.members).copied().collect();
        // Nothing expensive but the products (an argmax of their result would make a loop
        // kernel, which recomputes the prologue per element).
        let only_products =
            rest.iter().all(|&n| !is_expensive(&self.g.node(n).op) || matches!(self.g.node(n).op, Op::MatMul));
        only_products
            && row == Ok(KernelKind::Row { axes: p.axes(), shape: p.shape })
            && self.analyze(&rest, outs) == Ok(KernelKind::Loop)
    }

    /// Decides the kernel kind of a candidate group, or why it cannot be one kernel.
    pub(super) fn analyze(&self, members: &BTreeSet<NodeId>, outs: &[NodeId]) -> Result<KernelKind, Veto> {
        let g = self.g;
        if self.prologues.get() && self.gemv_row_prologue(members, outs) {
            return Ok(KernelKind::Loop);
        }
        // Reductions, argmax among them: a row kernel's, or each output's serial loop.
        let reduces: BTreeSet<NodeId> =
            members.iter().copied().filter(|&n| g.node(n).op.reduced_axes().is_some()).collect();
        let expensive: BTreeSet<NodeId> = members.iter().copied().filter(|&n| is_expensive(&g.node(n).op)).collect();
        // (Only expensive members' multiplicities matter: none, nothing to count.)
        let loop_ok = expensive.is_empty() || {
            let m = self.multiplicity(members, outs);
            expensive.iter().all(|e| m[e] <= 1.0 + 1e-9)
        };
        // A reduction that consumes an expensive member serializes its work in one thread.
        let reduce_after_expensive = !reduces.is_empty() && !expensive.is_empty() && {
            let after = self.dependents(members, &expensive);
            reduces.iter().any(|r| after.contains(r) || self.upstream(members, *r, &expensive))
        };
        let contractions = members.iter().filter(|&&n| matches!(g.node(n).op, Op::MatMul | Op::Conv2d { .. })).count();
        let loop_kind = if self.arithmetic_prologue(members) {
            Err(Veto::Prologue)
        } else if contractions > 1
            && !(self.opts.gemv && (self.sibling_products(members, outs) || self.paired_products(members, outs)))
        {
            Err(Veto::SecondContraction)
        } else if contractions == 1 && outs.len() > 1 {
            Err(Veto::SecondOutput)
        } else if !loop_ok {
            Err(Veto::DuplicatesExpensive)
        } else if reduce_after_expensive {
            Err(Veto::ReductionIntoReduction)
        } else {
            Ok(KernelKind::Loop)
        };
        if reduces.is_empty() {
            return loop_kind;
        }
        let row = self.row_kind(members, outs, &reduces);
        let long = reduces.iter().any(|&r| self.long_rows(r));
        match (loop_kind, row) {
            (Ok(l), Ok(r)) => Ok(if long { r } else { l }),
            // A loop kernel reduces each output's row serially in one invocation: fine for
            // short rows, but a long one (reductions over different rows merged as
            // siblings) starves a GPU of threads and passes a CPU adapter's loop limit.
            (Ok(_), Err(re)) if long => Err(re),
            (Ok(l), Err(_)) => Ok(l),
            (Err(_), Ok(r)) => Ok(r),
            (Err(e), Err(re)) => Err(if e == Veto::DuplicatesExpensive && reduces.len() > 1 { re } else { e }),
        }
    }

    /// Whether reduction `r` (a reduce or an argmax) reduces rows of at least
    /// `FusionOptions::min_row_len` elements: a row kernel's, not one invocation's.
    pub(super) fn long_rows(&self, r: NodeId) -> bool {
        let Some(axes) = self.g.node(r).op.reduced_axes() else { return false };
        let d = self.g.ty(self.g.operands(r)[0]).shape.dims();
        axes.iter().map(|&a| d[a]).product::<usize>() >= self.opts.min_row_len
    }

    pub(super) fn upstream(&self, members: &BTreeSet<NodeId>, from: NodeId, targets: &BTreeSet<NodeId>) -> bool {
        let mut stack = self.operands(from).to_vec();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if !members.contains(&n) || !seen.insert(n) {
                continue;
            }
            if targets.contains(&n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// Checks the row-kernel rules: every reduction reduces the same axes of the same shape;
    /// whatever depends on a reduction stays in that row (elementwise on the full or reduced
    /// shape, reshapes of the reduced shape, broadcasts back along the reduced axes).
    pub(super) fn row_kind(
        &self,
        members: &BTreeSet<NodeId>,
        outs: &[NodeId],
        reduces: &BTreeSet<NodeId>,
    ) -> Result<KernelKind, Veto> {
        let g = self.g;
        let mut space: Option<(Vec<usize>, Vec<usize>)> = None;
        for &r in reduces {
            let axes = g.node(r).op.reduced_axes().expect("filtered to reductions");
            let s = (g.ty(g.operands(r)[0]).shape.dims().to_vec(), axes);
            match &space {
                None => space = Some(s),
                Some(prev) if *prev == s => {}
                Some(_) => return Err(Veto::ReductionIntoReduction),
            }
        }
        let (shape, axes) = space.expect("at least one reduction");
        let full: usize = shape.iter().product();
        let kept: Vec<usize> =
            (0..shape.len()).filter(|a| !axes.contains(a) && shape[*a] != 1).map(|a| shape[a]).collect();
        let rows: usize = kept.iter().product();
        let reduced_like = |dims: &[usize]| dims.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>() == kept;
        if members.iter().any(|&n| is_expensive(&g.node(n).op) && !reduces.contains(&n)) {
            return Err(Veto::DuplicatesExpensive);
        }
        let dep = self.dependents(members, reduces);
        for &n in &dep {
            let node = g.node(n);
            let dims = node.ty.shape.dims();
            let ok = match &node.op {
                Op::Reduce { .. } | Op::ArgMax { .. } => true,
                op if op.is_elementwise() => dims == shape.as_slice() || reduced_like(dims),
                Op::Reshape { .. } => reduced_like(dims) && reduced_like(g.ty(g.operands(n)[0]).shape.dims()),
                Op::Broadcast { dims: map, .. } => {
                    let od = g.ty(g.operands(n)[0]).shape.dims();
                    dims == shape.as_slice()
                        && reduced_like(od)
                        && map.iter().zip(od).all(|(&ra, &d)| d == 1 || !axes.contains(&ra))
                }
                _ => false,
            };
            if !ok {
                return Err(Veto::RowShape);
            }
        }
        for &o in outs {
            let n = g.ty(o).shape.numel();
            if n != full
                && !(n == rows && (reduces.contains(&o) || dep.contains(&o) || reduced_like(g.ty(o).shape.dims())))
            {
                return Err(Veto::RowShape);
            }
        }
        Ok(KernelKind::Row { shape, axes })
    }

    /// Whether putting `p` into `group` would make the group depend on itself: some operand
    /// of `p` outside the group is reachable from a member of the group.
    pub(super) fn creates_cycle(&self, group: &BTreeSet<NodeId>, p: NodeId) -> bool {
        let outside: Vec<NodeId> = self.operands(p).iter().copied().filter(|o| !group.contains(o)).collect();
        self.reaches_any(outside, group)
    }

    /// Whether some member of `targets` is an operand, direct or not, of a node in `from`.
    pub(super) fn reaches_any(&self, from: Vec<NodeId>, targets: &BTreeSet<NodeId>) -> bool {
        if let Some(anc) = &self.ancestors {
            let to: Vec<usize> = targets.iter().map(|&t| self.pos(t)).collect();
            return from.iter().any(|&f| to.iter().any(|&t| anc.contains(self.pos(f), t)));
        }
        let min = targets.iter().map(|n| self.pos(*n)).min().unwrap_or(0);
        let mut stack: Vec<NodeId> = from.iter().flat_map(|&f| self.operands(f).iter().copied()).collect();
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            if self.pos(n) == usize::MAX || self.pos(n) < min || !seen.insert(n) {
                continue;
            }
            if targets.contains(&n) {
                return true;
            }
            stack.extend_from_slice(self.operands(n));
        }
        false
    }

    /// An execution order of kernels: Kahn's algorithm over their dependencies, the ready
    /// kernel with the earliest root (`Summary::root`) first.
    pub(super) fn order(&self, ks: &[&Summary]) -> Vec<usize> {
        let mut by_root: Vec<usize> = (0..ks.len()).collect();
        // Unique keys (root, then index): an unstable sort gives the stable order.
        by_root.sort_unstable_by_key(|&i| (ks[i].root, i));
        // Kahn's algorithm, taking kernels in root order as they come: usually each one's
        // inputs are stored by then. One that is not waits until they are, and is then taken
        // before any later root (it has the smallest rank of all ready kernels), as are the
        // kernels its outputs release in turn.
        let mut rank = vec![0; ks.len()];
        for (r, &i) in by_root.iter().enumerate() {
            rank[i] = r;
        }
        struct Kahn<'k> {
            ks: &'k [&'k Summary],
            by_root: Vec<usize>,
            rank: Vec<usize>,
            stored: Vec<bool>,
            /// Kernels waiting for a value, and how many values each still waits for.
            waiting: BTreeMap<NodeId, Vec<usize>>,
            missing: Vec<usize>,
            /// Waiting kernels whose inputs are all stored now, by rank.
            released: BinaryHeap<Reverse<usize>>,
            taken: Vec<bool>,
            order: Vec<usize>,
        }
        impl Kahn<'_> {
            /// Takes kernel `i`, then every kernel that releases.
            fn take(&mut self, i: usize) {
                let mut next = Some(i);
                while let Some(i) = next {
                    if std::mem::replace(&mut self.taken[i], true) {
                        // Taken while still waiting (see below), released since.
                        next = self.released.pop().map(|Reverse(r)| self.by_root[r]);
                        continue;
                    }
                    self.order.push(i);
                    for o in &self.ks[i].outputs {
                        if !std::mem::replace(&mut self.stored[o.index()], true) {
                            for w in self.waiting.remove(o).unwrap_or_default() {
                                self.missing[w] -= 1;
                                if self.missing[w] == 0 {
                                    self.released.push(Reverse(self.rank[w]));
                                }
                            }
                        }
                    }
                    next = self.released.pop().map(|Reverse(r)| self.by_root[r]);
                }
            }
        }
        let mut k = Kahn {
            ks,
            by_root,
            rank,
            stored: vec![false; self.index_bound],
            waiting: BTreeMap::new(),
            missing: vec![0; ks.len()],
            released: BinaryHeap::new(),
            taken: vec![false; ks.len()],
            order: Vec::with_capacity(ks.len()),
        };
        let mut deferred = Vec::new();
        for r in 0..ks.len() {
            let i = k.by_root[r];
            let absent: Vec<NodeId> =
                ks[i].inputs.iter().copied().filter(|v| !self.info[v.index()].leaf && !k.stored[v.index()]).collect();
            if absent.is_empty() {
                k.take(i);
            } else {
                k.missing[i] = absent.len();
                for v in absent {
                    k.waiting.entry(v).or_default().push(i);
                }
                deferred.push(i);
            }
        }
        // A kernel whose inputs no kernel stores cannot happen in a valid grouping; take the
        // earliest one left rather than drop it (`Ctx::kernels` refuses such an order).
        while k.order.len() < ks.len() {
            let i = *deferred.iter().find(|&&i| !k.taken[i]).expect("a kernel remains");
            k.take(i);
        }
        k.order
    }

    /// The kernels of `groups` in execution order ([`Ctx::order`]); an error if some kernel
    /// would read a value no earlier kernel stores (kernels that depend on each other: a
    /// bug of this pass, refused rather than run on stale memory).
    pub(super) fn kernels(&self, groups: &Groups) -> Result<Vec<Kernel>> {
        let sets: Vec<&BTreeSet<NodeId>> = groups.sets.iter().filter(|gr| !gr.is_empty()).collect();
        // In graph order of their roots (the peak check's order, which runs updates early,
        // is for judging; the scheduler makes the final order).
        let summaries: Vec<Summary> = sets
            .iter()
            .map(|gr| Summary { root: self.root(gr).map_or(0, |r| self.pos(r)), ..self.summary(gr, groups) })
            .collect();
        let order = self.order(&summaries.iter().collect::<Vec<_>>());
        let mut stored = vec![false; self.index_bound];
        for &i in &order {
            if let Some(v) = summaries[i].inputs.iter().find(|v| !self.info[v.index()].leaf && !stored[v.index()]) {
                return Err(IrError::Verify {
                    node: v.index(),
                    detail: "fusion grouped kernels that depend on each other: one reads this value before \
                             the other stores it (a fusegraph bug; `FusionMode::Off` compiles around it)"
                        .into(),
                });
            }
            for o in &summaries[i].outputs {
                stored[o.index()] = true;
            }
        }
        Ok(order
            .into_iter()
            .map(|i| {
                let mut members: Vec<NodeId> = sets[i].iter().copied().collect();
                members.sort_by_key(|n| self.pos(*n));
                let Summary { outputs, inputs, .. } = summaries[i].clone();
                let kind = self.analyze(sets[i], &outputs).unwrap_or(KernelKind::Loop);
                Kernel { kind, members, outputs, inputs }
            })
            .collect())
    }
}
