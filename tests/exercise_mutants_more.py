"""Wrong and right answers for the exercises of issue 35 (E6.4, E8.4, E9.3, E10.4, E11.1, E12.1-E12.3), as data.

A ``Mutant`` is a realistic wrong solution written as small edits to the reference body of one region: each
``(old, new)`` replaces text that occurs exactly once in that body. ``case`` is a substring of the name of the case
that must catch it. An ``Alternative`` is a different, correct body: the check must pass it.
``tests/test_exercises_new.py`` runs both; the lists are plain data so that they can join the main mutant test
(``tests/test_exercises_mutants.py``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:  # a small diff applied to the reference body of a region
    exercise: str
    unit: str
    edits: tuple[tuple[str, str], ...]
    case: str = ""
    index: int = 0
    name: str = ""


@dataclass(frozen=True)
class Alternative:  # a different correct body
    exercise: str
    unit: str
    body: str
    index: int = 0
    name: str = ""


MUTANTS: list[Mutant] = [
    # ---- E6.4: swap preemption -----------------------------------------------------------------------------------
    Mutant("E6.4", "Scheduler._preempt", (("swap and n > 0 and host.can_hold(n)", "swap and n > 0"),),
           "full host pool", name="swaps whether or not the host pool has room"),
    Mutant("E6.4", "Scheduler._preempt",
           (("host.allocate(rid, n)))\n", "host.allocate(rid, n)))\n            req.num_computed_tokens = 0\n"),),
           "swap out", name="drops the computed tokens of a swapped victim too"),
    Mutant("E6.4", "Scheduler._preempt", (("zip(self.pool.table(rid),", "zip(reversed(self.pool.table(rid)),"),),
           "swap out", name="copies the table out last block first"),
    Mutant("E6.4", "Scheduler._admit",
           (("list(zip(self.host_pool.free(rid), self.pool.table(rid)))",
             "list(zip(self.pool.table(rid), self.host_pool.free(rid)))"),),
           "swap in", name="lists the copies back as (device, host) pairs"),
    Mutant("E6.4", "Scheduler._admit",
           (("list(zip(self.host_pool.free(rid), self.pool.table(rid)))",
             "list(zip(self.host_pool.tables[rid], self.pool.table(rid)))"),),
           "swap out", name="never gives the host blocks back"),
    # ---- E8.4: eviction ------------------------------------------------------------------------------------------
    Mutant("E8.4", "BlockPool._take_free", (("popitem(last=False)", "popitem(last=True)"),),
           "fresh pool", name="takes the most recently freed block"),
    Mutant("E8.4", "BlockPool._take_free", (("            del self.hash_to_block[h]\n", ""),),
           "evicts it", name="leaves the evicted hash in the index"),
    Mutant("E8.4", "BlockPool._take_free", (("            self.block_hash[block] = None\n", ""),),
           "evicts it", name="keeps the evicted block's hash"),
    Mutant("E8.4", "BlockPool._take_free", (("            self.num_evictions += 1\n", ""),),
           "evicts it", name="does not count evictions"),
    Mutant("E8.4", "BlockPool._take_free", (("        self.ref_counts[block] = 1\n", ""),),
           "fresh pool", name="gives the block no reference"),
    # ---- E9.3: fair queuing's virtual time -------------------------------------------------------------------
    Mutant("E9.3", "FairPolicy.level", (("/ self.weight(tenant)", "* self.weight(tenant)"),),
           "level", name="multiplies by the weight"),
    Mutant("E9.3", "FairPolicy._next_tenant",
           (("key=lambda t: (self.level(t), self.queues[t][0].arrival_time)", "key=self.level"),),
           "lowest level goes next", name="breaks ties by tenant order, not by arrival"),
    Mutant("E9.3", "FairPolicy.pop",
           (("        self.vtime = max(self.vtime, self.level(tenant))  # the virtual time: the level served last, "
             "never lower\n", ""),),
           "pop moves the virtual time", name="never advances the virtual time"),
    Mutant("E9.3", "FairPolicy.pop", (("max(self.vtime, self.level(tenant))", "self.level(tenant)"),),
           "pop moves the virtual time", name="lets the virtual time fall"),
    Mutant("E9.3", "FairPolicy._queue",
           (("max(self.served[tenant], self.vtime * self.weight(tenant))", "self.served[tenant]"),),
           "back from idle", name="lets an idle tenant bank credit"),
    Mutant("E9.3", "FairPolicy._queue",
           (("max(self.served[tenant], self.vtime * self.weight(tenant))", "self.vtime * self.weight(tenant)"),),
           "back from idle", name="lowers what a returning tenant was served"),
    Mutant("E9.3", "FairPolicy._queue", (("self.vtime * self.weight(tenant))", "self.vtime)"),),
           "back from idle", name="re-enters at the virtual time, forgetting the weight"),
    # ---- E10.4: the attention terms of the cost model ----------------------------------------------------------
    Mutant("E10.4", "roofline_terms", (("per_pair = 4 *", "per_pair = 2 *"),),
           "one decode token", name="counts a multiply-add as one FLOP, or q.k only"),
    Mutant("E10.4", "roofline_terms", (("c.num_heads * c.head_dim", "c.num_kv_heads * c.head_dim"),),
           "one decode token", name="counts KV heads, not query heads, for the FLOPs"),
    Mutant("E10.4", "roofline_terms",
           (("kv * (shape.decode_context + shape.num_decode_tokens)", "kv * shape.decode_context"),),
           "one decode token", name="forgets the decode token's own K/V write"),
    Mutant("E10.4", "roofline_terms",
           (("kv * (shape.prefill_context + shape.num_prefill_tokens)", "kv * shape.prefill_pairs"),),
           "prefill chunk", name="reads K/V once per (query, key) pair"),
    Mutant("E10.4", "roofline_terms",
           (("per_pair * shape.prefill_pairs", "per_pair * shape.num_prefill_tokens"),),
           "prefill chunk", name="prices prefill attention as linear in the chunk"),
    # ---- E11.1: read a trace -----------------------------------------------------------------------------------
    Mutant("E11.1", "preemptions", (("swapped=d.swapped_blocks > 0", "swapped=False"),),
           "preempted twice", name="never marks a swap"),
    Mutant("E11.1", "preemptions", (("t.step, d.by, d.tokens", "t.step, d.request, d.tokens"),),
           "one preemption", name="names the victim as the one it made room for"),
    Mutant("E11.1", "preemptions",
           (("""        for d in t.decisions:
            if isinstance(d, Preempted):
                p = Preemption(d.request, t.step, d.by, d.tokens, swapped=d.swapped_blocks > 0)
                found.append(p)
                away[d.request] = p
        for rid in t.admitted:
            if rid in away:
                away.pop(rid).resumed = t.step
""", """        for rid in t.admitted:
            if rid in away:
                away.pop(rid).resumed = t.step
        for d in t.decisions:
            if isinstance(d, Preempted):
                p = Preemption(d.request, t.step, d.by, d.tokens, swapped=d.swapped_blocks > 0)
                found.append(p)
                away[d.request] = p
"""),),
           "very step that preempted it", name="reads a step's admissions before its preemptions"),
    # ---- E12.1: temperature, top-k and top-p -------------------------------------------------------------------
    Mutant("E12.1", "filter_logits",
           (("(probs.cumsum(dim=-1) - probs) >= top_p[:, None]", "probs.cumsum(dim=-1) > top_p[:, None]"),),
           "top-p keeps", name="top-p counts each token's own probability"),
    Mutant("E12.1", "filter_logits",
           (("sorted_logits.masked_fill(drop, float(\"-inf\")).softmax(dim=-1)", "sorted_logits.softmax(dim=-1)"),),
           "top-p applies to what top-k kept", name="top-p on the probabilities before top-k"),
    Mutant("E12.1", "filter_logits",
           (("logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)", "logits = sorted_logits"),),
           "top-k keeps", name="returns the logits in sorted order"),
    Mutant("E12.1", "filter_logits", (("ranks >= top_k[:, None]", "ranks > top_k[:, None]"),),
           "top-k keeps", name="keeps k + 1 tokens"),
    Mutant("E12.1", "filter_logits",
           (("    logits = logits / temperature[:, None]\n", ""),
            ("    return logits\n", "    return logits / temperature[:, None]\n")),
           "temperature comes before top-p", name="applies the temperature after filtering"),
    # ---- E12.2: the incremental detokenizer ------------------------------------------------------------------
    Mutant("E12.2", "Detokenizer.update", (("- max(map(len, stops)) + 1)", "- max(map(len, stops)))"),),
           "held-back text", name="holds back a whole stop string's length"),
    Mutant("E12.2", "Detokenizer.update",
           (("settled = settled[: max(0, len(settled) - max(map(len, stops)) + 1)]", "pass"),),
           "never sent", name="holds nothing back for stop strings"),
    Mutant("E12.2", "Detokenizer.update", (("settled = settled.rstrip(\"\\ufffd\")", "pass"),),
           "half a character", name="sends half a character"),
    Mutant("E12.2", "Detokenizer.update", (("if stops and ending in (None, \"length\"):", "if stops:"),),
           "another reason", name="cuts a request that an EOS ended"),
    Mutant("E12.2", "Detokenizer.update", (("text[:at], s, \"stop\"", "text[: at + len(s)], s, \"stop\""),),
           "never sent", name="keeps the stop string in the text"),
    # ---- E12.3: a streamed event -----------------------------------------------------------------------------
    Mutant("E12.3", "chunk", (("{\"role\": \"assistant\"} if first else {}", "{\"role\": \"assistant\"}"),),
           "chat chunk", name="sends the role in every chunk"),
    Mutant("E12.3", "chunk",
           (("    if reason is not None:\n        choice[\"stop_reason\"]", "    choice[\"stop_reason\"]"),),
           "last chunk", name="a stop reason in every chunk"),
    Mutant("E12.3", "chunk",
           (("    if gen.include_usage:\n        body[\"usage\"] = None", "    body[\"usage\"] = None"),),
           "include_usage", name="usage without include_usage"),
    Mutant("E12.3", "chunk", (("obj = \"chat.completion.chunk\"", "obj = \"chat.completion\""),),
           "chat chunk", name="the non-streaming object name"),
    Mutant("E12.3", "sse", (("\\n\\n\".encode()", "\\n\".encode()"),),
           "sse", name="ends an event with one newline"),
]

ALTERNATIVES: list[Alternative] = [
    Alternative("E6.4", "Scheduler._preempt", """
        swap = self.config.preemption_mode == "swap"
        if not (swap and n > 0 and host.can_hold(n)):
            req.num_computed_tokens = 0  # recompute
        else:
            host_blocks = host.allocate(rid, n)
            out.swap_out[rid] = [(d, h) for d, h in zip(self.pool.table(rid), host_blocks)]
        """, name="the recompute branch first, pairs by comprehension"),
    Alternative("E6.4", "Scheduler._admit", """
        if rid in self.host_pool:
            host_blocks = self.host_pool.free(rid)
            device_blocks = self.pool.allocate(rid, total_blocks)
            self.pool.append_slots(rid, req.num_computed_tokens)
            out.swap_in[rid] = list(zip(host_blocks, device_blocks))
        """, name="frees the host blocks first, pairs with what allocate returned"),
    Alternative("E8.4", "BlockPool._take_free", """
        block = next(iter(self.free_queue))
        del self.free_queue[block]
        if (h := self.block_hash[block]) is not None:
            self.hash_to_block.pop(h)
            self.block_hash[block] = None
            self.num_evictions += 1
        self.ref_counts[block] = 1
        return block
        """, name="the head by iteration, the walrus for the hash"),
    Alternative("E9.3", "FairPolicy.pop", """
        tenant = self._next_tenant()
        if self.level(tenant) > self.vtime:
            self.vtime = self.level(tenant)
        return self._take(tenant, self.queues[tenant].popleft())
        """, name="an if instead of max"),
    Alternative("E9.3", "FairPolicy._next_tenant", """
        return sorted(self.queues, key=lambda t: (self.level(t), self.queues[t][0].arrival_time))[0]
        """, name="the first of the sorted tenants"),
    Alternative("E10.4", "roofline_terms", """
        flops_per_pair = 2 * 2 * c.num_layers * c.num_heads * c.head_dim  # two products, a multiply-add each
        prefill = (flops_per_pair * shape.prefill_pairs, kv * shape.prefill_context + kv * shape.num_prefill_tokens)
        decode = (flops_per_pair * shape.decode_context, kv * shape.decode_context + kv * shape.num_decode_tokens)
        """, name="the factors spelled out, the bytes as two sums"),
    Alternative("E11.1", "preemptions", """
        found: list[Preemption] = []
        for t in trace:
            for d in t.decisions:
                if d.kind == "preempted":
                    found.append(Preemption(d.request, t.step, d.by, d.tokens, d.swapped_blocks > 0))
            for rid in t.admitted:
                for p in found:
                    if p.request == rid and p.resumed is None:
                        p.resumed = t.step
        return found
        """, name="closes the open preemption by search"),
    Alternative("E12.1", "filter_logits", """
        logits = logits / temperature[:, None]
        if bool((top_k < logits.shape[-1]).any()) or bool((top_p < 1).any()):
            for row, k, p in zip(logits, top_k.tolist(), top_p.tolist()):
                ranked, order = row.sort(descending=True)
                ranked[k:] = float("-inf")
                probs = ranked.softmax(dim=-1)
                ranked[probs.cumsum(dim=-1) - probs >= p] = float("-inf")
                row[order] = ranked  # the row is a view of logits: written in place
        return logits
        """, name="row by row"),
    Alternative("E12.2", "Detokenizer.update", """
        before = self.streamed.get(req.request_id, "")
        text = self.tokenizer.decode(req.output_token_ids)
        stops = req.params.stop or []
        found = None
        if ending is None or ending == "length":
            for s in stops:
                at = text.find(s, max(0, len(before) - len(s)))
                if at != -1:
                    text, found, ending = text[:at], s, "stop"
                    break
        if ending:
            settled = text
        else:
            hold = max((len(s) for s in stops), default=1) - 1
            settled = text[: max(0, len(text) - hold)].rstrip("\\ufffd")
        new = settled[len(before):] if settled.startswith(before) else ""
        self.streamed[req.request_id] = text if ending else before + new
        return TextUpdate(new, found)
        """, name="the hold-back computed once, 0 without stop strings"),
    Alternative("E12.3", "chunk", """
        reason = finish_reason(out)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason}
        if out.finished:
            choice["stop_reason"] = out.outputs[0].stop_reason
        if gen.kind == "chat":
            choice["delta"] = {**({"role": "assistant"} if first else {}), "content": out.new_text}
            kind = "chat.completion.chunk"
        else:
            choice["text"] = out.new_text
            kind = "text_completion"
        body = {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}
        return body | ({"usage": None} if gen.include_usage else {})
        """, name="the delta by unpacking, usage by a dict union"),
    Alternative("E12.3", "sse", """
        payload = data if isinstance(data, str) else json.dumps(data)
        return b"data: " + payload.encode() + b"\\n\\n"
        """, name="bytes joined"),
]
