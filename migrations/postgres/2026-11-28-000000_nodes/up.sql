-- The processes serving this database, for read-your-writes on every node (contract section 20): each
-- listening process's heartbeat, and whether a writer counted it out for not acknowledging a change in time (it
-- then distrusts everything it keeps, as when its channel drops). Rows of processes gone stop counting after a
-- few seconds without a heartbeat; each process removes its own when it stops.
CREATE TABLE endpoints_nodes (
    id TEXT PRIMARY KEY,
    seen_at TIMESTAMPTZ NOT NULL,
    counted_out BOOLEAN NOT NULL DEFAULT FALSE
);
