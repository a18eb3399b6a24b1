"""Every checker catches realistic wrong solutions.

Each mutant below is a plausible student answer with one mistake -- an off-by-one block count, a free
list in the wrong order, a softmax without the running maximum, a lookup that does not stop at a miss,
an SLO test that counts refused requests. The test runs it in place of the reference (in this process,
through ``StandIns.try_body``: no file is edited) and asserts that the exercise's check fails on its own
code -- not on a stub, not on an error of the checker -- and, where it says, at the case meant to catch it.
"""

from __future__ import annotations

import pytest

from minfer.exercises import StandIns, run_exercise

MUTANTS = {
    # ---- E1.1: the KV-cache step ------------------------------------------------------------------------
    "E1.1 attends without the position mask": ("E1.1", "ContiguousKVCache.attention", """
        kc, vc = self.k[layer], self.v[layer]
        kc[rows, positions] = k.view(b, q_len, *k.shape[1:])
        vc[rows, positions] = v.view(b, q_len, *v.shape[1:])
        keys = kc[slots, :length].transpose(1, 2)
        values = vc[slots, :length].transpose(1, 2)
        queries = q.view(b, q_len, *q.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, enable_gqa=True)
        return out.transpose(1, 2).reshape(b * q_len, *q.shape[1:])
        """, "one sequence"),
    "E1.1 uses is_causal instead of positions": ("E1.1", "ContiguousKVCache.attention", """
        kc, vc = self.k[layer], self.v[layer]
        kc[rows, positions] = k.view(b, q_len, *k.shape[1:])
        vc[rows, positions] = v.view(b, q_len, *v.shape[1:])
        keys = kc[slots, :length].transpose(1, 2)
        values = vc[slots, :length].transpose(1, 2)
        queries = q.view(b, q_len, *q.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, is_causal=True, enable_gqa=True)
        return out.transpose(1, 2).reshape(b * q_len, *q.shape[1:])
        """, "one sequence"),
    "E1.1 reads strip b instead of slots[b]": ("E1.1", "ContiguousKVCache.attention", """
        kc, vc = self.k[layer], self.v[layer]
        kc[rows, positions] = k.view(b, q_len, *k.shape[1:])
        vc[rows, positions] = v.view(b, q_len, *v.shape[1:])
        keys = kc[:b, :length].transpose(1, 2)
        values = vc[:b, :length].transpose(1, 2)
        queries = q.view(b, q_len, *q.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None], enable_gqa=True)
        return out.transpose(1, 2).reshape(b * q_len, *q.shape[1:])
        """, "two rows"),
    "E1.1 stores each token one position late": ("E1.1", "ContiguousKVCache.attention", """
        kc, vc = self.k[layer], self.v[layer]
        kc[rows, positions + 1] = k.view(b, q_len, *k.shape[1:])
        vc[rows, positions + 1] = v.view(b, q_len, *v.shape[1:])
        keys = kc[slots, :length].transpose(1, 2)
        values = vc[slots, :length].transpose(1, 2)
        queries = q.view(b, q_len, *q.shape[1:]).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=visible[:, None], enable_gqa=True)
        return out.transpose(1, 2).reshape(b * q_len, *q.shape[1:])
        """, "one sequence"),
    # ---- E2.1: static batching's slot accounting ---------------------------------------------------------
    "E2.1 counts one decode pass too many": ("E2.1", "slot_accounting", """
        steps = []
        for batch in _batches(len(prompt_lens), batch_size):
            lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
            b, idle = len(batch), batch_size - len(batch)
            steps.append({"batch_slots": batch_size, "useful": sum(lens), "padding": b * max(lens) - sum(lens),
                          "idle_slots": idle, "bubbles": 0})
            for t in range(max(outs)):
                live = sum(t < n for n in outs)
                steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": idle,
                              "bubbles": b - live})
        return steps
        """, "one batch of 3"),
    "E2.1 counts empty slots as bubbles": ("E2.1", "slot_accounting", """
        steps = []
        for batch in _batches(len(prompt_lens), batch_size):
            lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
            b = len(batch)
            steps.append({"batch_slots": batch_size, "useful": sum(lens), "padding": b * max(lens) - sum(lens),
                          "idle_slots": 0, "bubbles": 0})
            for t in range(1, max(outs)):
                live = sum(t < n for n in outs)
                steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": 0,
                              "bubbles": batch_size - live})
        return steps
        """, "one batch of 3"),
    "E2.1 counts the whole padded rectangle as padding": ("E2.1", "slot_accounting", """
        steps = []
        for batch in _batches(len(prompt_lens), batch_size):
            lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
            b, idle = len(batch), batch_size - len(batch)
            steps.append({"batch_slots": batch_size, "useful": sum(lens), "padding": b * max(lens),
                          "idle_slots": idle, "bubbles": 0})
            for t in range(1, max(outs)):
                live = sum(t < n for n in outs)
                steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": idle,
                              "bubbles": b - live})
        return steps
        """, "one batch of 3"),
    "E2.1 keeps a row live one pass too long": ("E2.1", "slot_accounting", """
        steps = []
        for batch in _batches(len(prompt_lens), batch_size):
            lens, outs = [prompt_lens[i] for i in batch], [output_lens[i] for i in batch]
            b, idle = len(batch), batch_size - len(batch)
            steps.append({"batch_slots": batch_size, "useful": sum(lens), "padding": b * max(lens) - sum(lens),
                          "idle_slots": idle, "bubbles": 0})
            for t in range(1, max(outs)):
                live = sum(t <= n for n in outs)
                steps.append({"batch_slots": batch_size, "useful": live, "padding": 0, "idle_slots": idle,
                              "bubbles": b - live})
        return steps
        """, "one batch of 3"),
    # ---- E3.1: the BlockPool -----------------------------------------------------------------------------
    "E3.1 blocks_for rounds down": ("E3.1", "BlockPool.blocks_for", """
        return num_tokens // self.block_size
        """, "blocks_for"),
    "E3.1 blocks_for is one too many at exact multiples": ("E3.1", "BlockPool.blocks_for", """
        return num_tokens // self.block_size + 1
        """, "blocks_for"),
    "E3.1 blocks_needed forgets the tokens already held": ("E3.1", "BlockPool.blocks_needed", """
        return self.blocks_for(num_new_tokens)
        """, "try_append_slots"),
    "E3.1 blocks_needed goes negative for a reserved table": ("E3.1", "BlockPool.blocks_needed", """
        return self.blocks_for(self.num_tokens.get(owner, 0) + num_new_tokens) - len(self.tables.get(owner, ()))
        """, "blocks_needed"),
    "E3.1 allocate takes the most recently freed block": ("E3.1", "BlockPool.allocate", """
        if n < 0 or n > len(self.free_queue):
            raise BlockPoolError(f"cannot allocate {n} blocks")
        blocks = []
        for _ in range(n):
            block, _ = self.free_queue.popitem(last=True)
            self.ref_counts[block] = 1
            blocks.append(block)
        self.tables.setdefault(owner, []).extend(blocks)
        self.num_tokens.setdefault(owner, 0)
        self.num_hashed.setdefault(owner, 0)
        return blocks
        """, "allocate: blocks come from the head"),
    "E3.1 allocate takes blocks before checking there are enough": ("E3.1", "BlockPool.allocate", """
        blocks = []
        for _ in range(n):
            if not self.free_queue:
                raise BlockPoolError(f"{owner!r} asked for {n} blocks")
            blocks.append(self._take_free())
        self.tables.setdefault(owner, []).extend(blocks)
        self.num_tokens.setdefault(owner, 0)
        self.num_hashed.setdefault(owner, 0)
        return blocks
        """, "too many blocks"),
    "E3.1 try_append_slots refuses an exact fit": ("E3.1", "BlockPool.try_append_slots", """
        need = self.blocks_needed(owner, num_new_tokens)
        if need >= len(self.free_queue) and need > 0:
            return None
        blocks = self.allocate(owner, need)
        self.num_tokens[owner] += num_new_tokens
        return blocks
        """, None),
    "E3.1 try_append_slots leaves an empty table behind when it fails": ("E3.1", "BlockPool.try_append_slots", """
        self.tables.setdefault(owner, [])
        self.num_tokens.setdefault(owner, 0)
        self.num_hashed.setdefault(owner, 0)
        need = self.blocks_needed(owner, num_new_tokens)
        if need > len(self.free_queue):
            return None
        blocks = self.allocate(owner, need)
        self.num_tokens[owner] += num_new_tokens
        return blocks
        """, "pool is short"),
    "E3.1 free returns the blocks head first": ("E3.1", "BlockPool.free", """
        if owner not in self.tables:
            raise BlockPoolError(f"{owner!r} owns no blocks")
        for b in self.tables.pop(owner):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None
        del self.num_tokens[owner], self.num_hashed[owner]
        """, "free: every block comes back"),
    "E3.1 free ignores the reference count": ("E3.1", "BlockPool.free", """
        if owner not in self.tables:
            raise BlockPoolError(f"{owner!r} owns no blocks")
        for b in reversed(self.tables.pop(owner)):
            self.ref_counts[b] = 0
            self.free_queue[b] = None
        del self.num_tokens[owner], self.num_hashed[owner]
        """, "shared by two tables"),
    "E3.1 free forgets the owner's token count": ("E3.1", "BlockPool.free", """
        if owner not in self.tables:
            raise BlockPoolError(f"{owner!r} owns no blocks")
        for b in reversed(self.tables.pop(owner)):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_queue[b] = None
        """, None),
    # ---- E4.1: the scheduler's running loop -----------------------------------------------------------
    "E4.1 leaves prompts under way unfinished": ("E4.1", "Scheduler._schedule_running", """
            running, preempted_before = self.running, len(out.preempted)
            i = 0
            while i < len(running) and budget.tokens > 0:
                req = running[i]
                n = req.num_tokens - req.num_computed_tokens
                decode = n == 1 and len(req.output_token_ids) > 0
                if not decode:
                    i += 1
                    continue
                if not self._make_room(req, n, out):
                    break
                table = self.pool.table(req.request_id)
                out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, table))
                self.policy.on_scheduled(req, n)
                budget.spend(n, decode)
                i += 1
            return len(out.preempted) > preempted_before
        """, "a prompt in chunks"),
    "E4.1 gives a running prompt all the rest at once": ("E4.1", "Scheduler._schedule_running", """
            running, preempted_before = self.running, len(out.preempted)
            i = 0
            while i < len(running) and budget.tokens > 0:
                req = running[i]
                n = req.num_tokens - req.num_computed_tokens
                decode = n == 1 and len(req.output_token_ids) > 0
                if not decode:
                    if n <= 0:
                        i += 1
                        continue
                if not self._make_room(req, n, out):
                    break
                table = self.pool.table(req.request_id)
                out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, table))
                self.policy.on_scheduled(req, n)
                budget.spend(n, decode)
                i += 1
            return len(out.preempted) > preempted_before
        """, "a prompt in chunks"),
    "E4.1 takes a prompt's last token for a decode": ("E4.1", "Scheduler._schedule_running", """
            running, preempted_before = self.running, len(out.preempted)
            i = 0
            while i < len(running) and budget.tokens > 0:
                req = running[i]
                n = req.num_tokens - req.num_computed_tokens
                decode = n == 1
                if not decode:
                    n = budget.prefill_chunk(n)
                    if n <= 0:
                        i += 1
                        continue
                if not self._make_room(req, n, out):
                    break
                table = self.pool.table(req.request_id)
                out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, table))
                self.policy.on_scheduled(req, n)
                budget.spend(n, decode)
                i += 1
            return len(out.preempted) > preempted_before
        """, None),
    "E4.1 does not spend the budget on decodes": ("E4.1", "Scheduler._schedule_running", """
            running, preempted_before = self.running, len(out.preempted)
            i = 0
            while i < len(running) and budget.tokens > 0:
                req = running[i]
                n = req.num_tokens - req.num_computed_tokens
                decode = n == 1 and len(req.output_token_ids) > 0
                if not decode:
                    n = budget.prefill_chunk(n)
                    if n <= 0:
                        i += 1
                        continue
                if not self._make_room(req, n, out):
                    break
                table = self.pool.table(req.request_id)
                out.chunks.append(ScheduledChunk(req, req.num_computed_tokens, n, decode, table))
                self.policy.on_scheduled(req, n)
                if not decode:
                    budget.spend(n, decode)
                i += 1
            return len(out.preempted) > preempted_before
        """, "the token budget"),
    # ---- E5.1: the chunk budget -----------------------------------------------------------------------------
    "E5.1 a chunk ignores the token budget": ("E5.1", "StepBudget.prefill_chunk", """
        return min(remaining, self.prompt) if self.chunks > 0 else 0
        """, "prefill_chunk"),
    "E5.1 a chunk ignores the chunk limit": ("E5.1", "StepBudget.prefill_chunk", """
        return min(remaining, self.prompt, self.tokens)
        """, "prefill_chunk"),
    "E5.1 decodes spend the prompt budget": ("E5.1", "StepBudget.spend", """
        self.tokens -= num_tokens
        self.prompt -= num_tokens
        if not decode:
            self.chunks -= 1
        """, "spend"),
    "E5.1 a chunk is never counted": ("E5.1", "StepBudget.spend", """
        self.tokens -= num_tokens
        if not decode:
            self.prompt -= num_tokens
        """, "spend"),
    # ---- E6.1: the preemption victim ------------------------------------------------------------------------
    "E6.1 preempts the oldest request": ("E6.1", "Scheduler._make_room", """
        while self.pool.try_append_slots(req.request_id, n) is None:
            victim = self.running[0]
            self._preempt(victim, out, by=req)
            if victim is req:
                return False
        return True
        """, "most recently admitted"),
    "E6.1 always preempts the request that needs the block": ("E6.1", "Scheduler._make_room", """
        if self.pool.try_append_slots(req.request_id, n) is None:
            self._preempt(req, out, by=req)
            return False
        return True
        """, None),
    "E6.1 preempts once and gives up": ("E6.1", "Scheduler._make_room", """
        if self.pool.try_append_slots(req.request_id, n) is not None:
            return True
        victim = self.running[-1]
        self._preempt(victim, out, by=req)
        return victim is not req and self.pool.try_append_slots(req.request_id, n) is not None
        """, None),
    "E6.1 keeps preempting after the request itself went": ("E6.1", "Scheduler._make_room", """
        while self.pool.try_append_slots(req.request_id, n) is None:
            victim = self.running[-1]
            self._preempt(victim, out, by=req)
        return True
        """, None),
    # ---- E7.1: the online softmax -----------------------------------------------------------------------
    "E7.1 softmax without the running max": ("E7.1", "paged_attention_kernel", """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
            slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            p = tl.exp2(s)
            l_i = l_i + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        """, "large scores"),
    "E7.1 forgets to rescale the weighted sum": ("E7.1", "paged_attention_kernel", """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
            slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        """, None),
    "E7.1 a query cannot see itself": ("E7.1", "paged_attention_kernel", """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
            slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] < q_pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        """, "context 0"),
    "E7.1 ignores the block table": ("E7.1", "paged_attention_kernel", """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block = (k_pos // BLOCK_SIZE).to(tl.int64)
            slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        """, None),
    "E7.1 natural exp on base-2 scores": ("E7.1", "paged_attention_kernel", """
        for start in range(0, kv_end, BLOCK_N):
            k_pos = start + n
            k_ok = k_pos < kv_end
            block = tl.load(table + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
            slot = block * stride_cb + (k_pos % BLOCK_SIZE) * stride_ct + kv_head * stride_ch
            kv_mask = k_ok[:, None] & d_ok[None, :]
            k = tl.load(k_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale
            s = tl.where(k_ok[None, :] & (k_pos[None, :] <= q_pos[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_cache_ptr + slot[:, None] + d[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        """, None),
    # ---- E8.1: prefix lookup and share --------------------------------------------------------------------
    "E8.1 lookup skips over a miss": ("E8.1", "BlockPool.lookup", """
        return [self.hash_to_block[h] for h in hashes if h in self.hash_to_block]
        """, "a miss ends the prefix"),
    "E8.1 share leaves free cached blocks in the free list": ("E8.1", "BlockPool.share", """
        if owner in self.tables:
            raise BlockPoolError(f"{owner!r} already holds blocks")
        for b in blocks:
            if self.block_hash[b] is None:
                raise BlockPoolError(f"block {b} is not cached")
        for b in blocks:
            self.ref_counts[b] += 1
        self.tables[owner] = list(blocks)
        self.num_tokens[owner] = len(blocks) * self.block_size
        self.num_hashed[owner] = len(blocks)
        """, "free cached block"),
    "E8.1 share counts references before it validates": ("E8.1", "BlockPool.share", """
        if owner in self.tables:
            raise BlockPoolError(f"{owner!r} already holds blocks")
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
            if self.block_hash[b] is None:
                raise BlockPoolError(f"block {b} is not cached")
        self.tables[owner] = list(blocks)
        self.num_tokens[owner] = len(blocks) * self.block_size
        self.num_hashed[owner] = len(blocks)
        """, "refuses"),
    "E8.1 share shares a partly filled block": ("E8.1", "BlockPool.share", """
        if owner in self.tables:
            raise BlockPoolError(f"{owner!r} already holds blocks")
        for b in blocks:
            if self.ref_counts[b] == 0:
                del self.free_queue[b]
            self.ref_counts[b] += 1
        self.tables[owner] = list(blocks)
        self.num_tokens[owner] = len(blocks) * self.block_size
        self.num_hashed[owner] = len(blocks)
        """, "refuses"),
    "E8.1 looks up every full block, leaving nothing to compute": ("E8.1", "Scheduler._prefix_hits", """
        if not self.config.enable_prefix_caching:
            return []
        req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)
        return self.pool.lookup(req.block_hashes)
        """, "the engine with prefix caching"),
    "E8.1 looks up one block too few": ("E8.1", "Scheduler._prefix_hits", """
        if not self.config.enable_prefix_caching:
            return []
        req.block_hashes = chain_hashes(req.all_token_ids(), self.block_size, req.block_hashes)
        return self.pool.lookup(req.block_hashes[: (req.num_tokens - 1) // self.block_size - 1])
        """, "the engine with prefix caching"),
    # ---- E9.1: shortest job first ---------------------------------------------------------------------------
    "E9.1 sizes a job by its prompt alone": ("E9.1", "ShortestJobFirstPolicy.order", """
        return (req.num_prompt_tokens, 0 if front else 1, req.arrival_time)
        """, "least work first"),
    "E9.1 serves the longest job first": ("E9.1", "ShortestJobFirstPolicy.order", """
        return (-(req.num_prompt_tokens + req.params.max_tokens), 0 if front else 1, req.arrival_time)
        """, "least work first"),
    "E9.1 ranks by the tokens so far (the rank moves while it runs)": ("E9.1", "ShortestJobFirstPolicy.rank", """
        return (req.num_tokens, req.admitted_seq)
        """, "never changes"),
    "E9.1 ranks by admission only (preempts the newest, not the longest)": ("E9.1", "ShortestJobFirstPolicy.rank", """
        return req.admitted_seq
        """, None),
    # ---- E10.1: goodput ----------------------------------------------------------------------------------
    "E10.1 refused requests count as good": ("E10.1", "SLO.met_by", """
        m = req.metrics
        if self.ttft is not None and (m.ttft is None or m.ttft > self.ttft):
            return False
        if self.tpot is not None and m.tpot is not None and m.tpot > self.tpot:
            return False
        return not (self.e2e is not None and (m.e2e is None or m.e2e > self.e2e))
        """, "not served"),
    "E10.1 a target met exactly fails": ("E10.1", "SLO.met_by", """
        m = req.metrics
        if req.finish_reason not in ("stop", "length"):
            return False
        if self.ttft is not None and (m.ttft is None or m.ttft >= self.ttft):
            return False
        if self.tpot is not None and m.tpot is not None and m.tpot >= self.tpot:
            return False
        return not (self.e2e is not None and (m.e2e is None or m.e2e >= self.e2e))
        """, "met exactly"),
    "E10.1 a one-token answer misses any TPOT target": ("E10.1", "SLO.met_by", """
        m = req.metrics
        if req.finish_reason not in ("stop", "length"):
            return False
        if self.ttft is not None and (m.ttft is None or m.ttft > self.ttft):
            return False
        if self.tpot is not None and (m.tpot is None or m.tpot > self.tpot):
            return False
        return not (self.e2e is not None and (m.e2e is None or m.e2e > self.e2e))
        """, "one-token"),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_checker_catches_wrong_solution(name):
    exercise, unit, body, case = MUTANTS[name]
    with StandIns() as swap:
        swap.try_body(exercise, unit, body)
        result = run_exercise(exercise, timeout=60)
    assert result.status == "failed", f"{name}: the check did not fail ({result.status})\n{result.report()}"
    assert result.stub is None, f"{name}: failed on a stub, not on the wrong code\n{result.report()}"
    if case is not None:
        assert case in (result.case or ""), f"{name}: caught at the wrong case\n{result.report()}"


@pytest.mark.needs_exercise("E3.1")
def test_a_failed_check_leaves_the_engine_as_it_was():
    """A check swaps code in and out; after a failing one, every function is the original again."""
    from minfer.kv.block_pool import BlockPool

    before = dict(vars(BlockPool))
    with StandIns() as swap:
        swap.try_body("E3.1", "BlockPool.blocks_for", "return 0")
        assert BlockPool.blocks_for is not before["blocks_for"]
        assert not run_exercise("E3.1").passed
    assert dict(vars(BlockPool)) == before
    assert run_exercise("E3.1").passed


@pytest.mark.needs_exercise("E2.1")
def test_a_check_first_imported_during_a_stand_in_checks_the_reference_after_it():
    """A module imported while a wrong answer stood in for a module-level function took the wrong answer by
    name; leaving the stand-in gives it the original back, or that check would grade the wrong answer ever after."""
    import sys

    sys.modules.pop("minfer.exercises.checks.ch02", None)  # imported afresh, inside the stand-in
    exercise, unit, body, _ = MUTANTS["E2.1 counts one decode pass too many"]
    with StandIns() as swap:
        swap.try_body(exercise, unit, body)
        assert not run_exercise(exercise).passed
    assert run_exercise(exercise).passed
