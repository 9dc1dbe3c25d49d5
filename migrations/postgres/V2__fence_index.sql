-- The fence check at start (src/store/postgres/sequence.rs) asks whether any fence in `leases`
-- is at or above the sequence's next value. Fences are issued in the order rows are appended,
-- so block summaries answer that from a few pages however long the history grows, and an
-- insert into a range not yet summarized writes nothing here (a B-tree would cost every
-- acquisition one more index write, a scan of the table grows with the history).
CREATE INDEX leases_fence_brin ON leases USING brin (fence);
