//! Tables as diesel sees them; kept in step with `migrations/{sqlite,postgres}` by hand.

diesel::table! {
    projects (id) {
        id -> BigInt,
        name -> Text,
        created_at -> BigInt,
        token_secret -> Nullable<Text>,
        allowed_origins -> Text,
    }
}

diesel::table! {
    api_keys (id) {
        id -> Text,
        project_id -> BigInt,
        label -> Text,
        scopes -> Text,
        secret_hash -> Text,
        prefix -> Text,
        created_at -> BigInt,
        expires_at -> Nullable<BigInt>,
        revoked_at -> Nullable<BigInt>,
        last_used_at -> Nullable<BigInt>,
    }
}

diesel::table! {
    endpoints (id) {
        id -> Text,
        project_id -> BigInt,
        name -> Text,
        description -> Text,
        derived_from_insight -> Nullable<Text>,
        is_active -> Bool,
        is_materialized -> Bool,
        cache_age_seconds -> Nullable<BigInt>,
        sync_frequency -> Nullable<Text>,
        current_version -> BigInt,
        created_at -> BigInt,
        updated_at -> BigInt,
        last_executed_at -> Nullable<BigInt>,
        freshness_seconds -> Nullable<BigInt>,
        hibernate_after_days -> Nullable<BigInt>,
    }
}

diesel::table! {
    endpoint_versions (endpoint_id, version) {
        endpoint_id -> Text,
        version -> BigInt,
        query -> Text,
        description -> Text,
        output_columns -> Text,
        cache_age_seconds -> Nullable<BigInt>,
        sync_frequency -> Nullable<Text>,
        created_at -> BigInt,
        eligibility -> Nullable<Text>,
        source_tables -> Nullable<Text>,
        plan_error -> Nullable<Text>,
        breaking_changes -> Text,
    }
}

diesel::table! {
    materializations (endpoint_id) {
        endpoint_id -> Text,
        version -> BigInt,
        status -> Text,
        next_run_at -> BigInt,
        error -> Nullable<Text>,
        result_version -> Nullable<BigInt>,
        result_location -> Nullable<Text>,
        result_row_count -> Nullable<BigInt>,
        result_at -> Nullable<BigInt>,
        lease_token -> Nullable<Text>,
        lease_expires_at -> Nullable<BigInt>,
        revision -> BigInt,
        appended_since -> Nullable<BigInt>,
        result_data_as_of -> Nullable<BigInt>,
        full_refreshes -> BigInt,
        result_coverage -> Nullable<Text>,
        last_folded_at -> Nullable<BigInt>,
        rows_folded -> BigInt,
        result_fold -> Nullable<Text>,
        result_fold_reason -> Nullable<Text>,
    }
}

diesel::table! {
    table_leases (project_id, table_name) {
        project_id -> BigInt,
        table_name -> Text,
        holder -> Text,
        expires_at -> BigInt,
    }
}

diesel::table! {
    append_keys (project_id, table_name, idempotency_key) {
        project_id -> BigInt,
        table_name -> Text,
        idempotency_key -> Text,
        body_sha256 -> Text,
        write_id -> Text,
        answer -> Nullable<Text>,
        created_at -> BigInt,
        updated_at -> BigInt,
        writer -> Nullable<Text>,
    }
}

diesel::table! {
    endpoint_reads (project_id, table_name, endpoint_id) {
        project_id -> BigInt,
        table_name -> Text,
        endpoint_id -> Text,
    }
}

diesel::allow_tables_to_appear_in_same_query!(
    projects,
    api_keys,
    endpoints,
    endpoint_versions,
    endpoint_reads,
    materializations,
    table_leases,
    append_keys
);
