-- Initial schema, DESIGN.md §2 (PostgreSQL).
--
-- ids: TEXT, hyphenated UUID (same text as SQLite, so one set of queries and
-- one decoder serve both). Times: BIGINT UTC epoch milliseconds. JSON: TEXT.
-- Windows: TEXT 'HH:MM'. Every integer is BIGINT except
-- action_details.position (INTEGER, i32 in the model).
-- created_at/updated_at default to now so operator SQL may omit them; the
-- application always sets them.

CREATE TABLE brands (
    id          TEXT    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL,
    settings    TEXT    NOT NULL DEFAULT '{}',
    created_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE TABLE branches (
    id          TEXT    NOT NULL PRIMARY KEY,
    brand_id    TEXT    NOT NULL REFERENCES brands (id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    timezone    TEXT    NULL,
    is_active   BOOLEAN NOT NULL DEFAULT TRUE,
    created_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE INDEX branches_brand_id_idx ON branches (brand_id);

CREATE TABLE rules (
    id              TEXT    NOT NULL PRIMARY KEY,
    brand_id        TEXT    NULL REFERENCES brands (id) ON DELETE CASCADE,
    name            TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
    cron_expression TEXT    NOT NULL,
    settings        TEXT    NOT NULL DEFAULT '{}',
    created_at      BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at      BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE INDEX rules_brand_id_idx ON rules (brand_id);

CREATE TABLE brand_rules (
    id              TEXT    NOT NULL PRIMARY KEY,
    brand_id        TEXT    NOT NULL REFERENCES brands (id) ON DELETE CASCADE,
    rule_id         TEXT    NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    settings        TEXT    NOT NULL DEFAULT '{}',
    cron_expression TEXT    NULL,
    created_at      BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at      BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE INDEX brand_rules_brand_id_idx ON brand_rules (brand_id);
CREATE INDEX brand_rules_rule_id_idx ON brand_rules (rule_id);

CREATE TABLE action_templates (
    id          TEXT    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    config      TEXT    NOT NULL DEFAULT '{}',
    created_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at  BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE TABLE branch_rules (
    id                   TEXT    NOT NULL PRIMARY KEY,
    branch_id            TEXT    NOT NULL REFERENCES branches (id) ON DELETE CASCADE,
    rule_id              TEXT    NOT NULL REFERENCES rules (id) ON DELETE CASCADE,
    brand_rule_id        TEXT    NULL REFERENCES brand_rules (id) ON DELETE SET NULL,
    is_active            BOOLEAN NOT NULL DEFAULT TRUE,
    is_archived          BOOLEAN NOT NULL DEFAULT FALSE,
    is_force_stopped     BOOLEAN NOT NULL DEFAULT FALSE,
    is_currently_running BOOLEAN NOT NULL DEFAULT FALSE,
    operation_time_from  TEXT    NULL,
    operation_time_to    TEXT    NULL,
    next_run_time        BIGINT  NULL,
    last_run_time        BIGINT  NULL,
    lock_holder          TEXT    NULL,
    lock_time            BIGINT  NULL,
    lock_epoch           BIGINT  NOT NULL DEFAULT 0,
    params               TEXT    NOT NULL DEFAULT '{}',
    created_at           BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at           BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

CREATE INDEX branch_rules_next_run_time_idx ON branch_rules (next_run_time);
CREATE INDEX branch_rules_branch_id_idx ON branch_rules (branch_id);
CREATE INDEX branch_rules_rule_id_idx ON branch_rules (rule_id);
CREATE INDEX branch_rules_brand_rule_id_idx ON branch_rules (brand_rule_id);

CREATE TABLE action_details (
    id                 TEXT    NOT NULL PRIMARY KEY,
    branch_rule_id     TEXT    NOT NULL REFERENCES branch_rules (id) ON DELETE CASCADE,
    action_template_id TEXT    NOT NULL REFERENCES action_templates (id) ON DELETE RESTRICT,
    position           INTEGER NOT NULL,
    params             TEXT    NOT NULL DEFAULT '{}',
    created_at         BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at         BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);

-- Serves both the plan load order and the cascade from branch_rules.
CREATE INDEX action_details_branch_rule_position_idx ON action_details (branch_rule_id, position);
CREATE INDEX action_details_action_template_id_idx ON action_details (action_template_id);

CREATE TABLE executions (
    id             TEXT    NOT NULL PRIMARY KEY,
    branch_rule_id TEXT    NOT NULL REFERENCES branch_rules (id) ON DELETE CASCADE,
    scheduled_for  BIGINT  NOT NULL,
    status         TEXT    NOT NULL DEFAULT 'requested' CHECK (status IN
                       ('requested', 'scheduled', 'running', 'completed', 'failed', 'cancelled', 'timed_out')),
    attempt        BIGINT  NOT NULL DEFAULT 1 CHECK (attempt >= 1),
    owner          TEXT    NULL,
    lock_epoch     BIGINT  NOT NULL DEFAULT 0,
    requested_at   BIGINT  NOT NULL,
    scheduled_at   BIGINT  NULL,
    started_at     BIGINT  NULL,
    finished_at    BIGINT  NULL,
    error          TEXT    NULL,
    output         TEXT    NULL,
    created_at     BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at     BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    CONSTRAINT executions_occurrence_key UNIQUE (branch_rule_id, scheduled_for, attempt)
);

CREATE INDEX executions_status_idx ON executions (status);
CREATE INDEX executions_owner_idx ON executions (owner);
CREATE INDEX executions_branch_rule_scheduled_idx ON executions (branch_rule_id, scheduled_for);

CREATE TABLE instances (
    id           TEXT    NOT NULL PRIMARY KEY,
    hostname     TEXT    NOT NULL,
    pid          BIGINT  NOT NULL,
    started_at   BIGINT  NOT NULL,
    heartbeat_at BIGINT  NOT NULL,
    partition    TEXT    NULL,
    created_at   BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT,
    updated_at   BIGINT  NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT
);
