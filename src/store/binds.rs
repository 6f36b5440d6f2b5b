//! Values for statements assembled at run time. One list of binds serves
//! either sqlx backend and the SQLite writer's direct handle (`direct`), so
//! a statement is built once whatever runs it.

/// One bound value. Nullable values keep their type so PostgreSQL gets a
/// typed NULL.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Bind {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    OptInt(Option<i64>),
    Bool(bool),
}

/// `$1, $2, …, $count`: the parameters of one list, as both backends
/// number them.
pub(super) fn placeholder_list(count: usize) -> String {
    (1..=count)
        .map(|n| format!("${n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `sqlx::query($sql)` with every bind of `$binds` bound in order.
macro_rules! bound_query {
    ($sql:expr, $binds:expr) => {{
        use $crate::store::binds::Bind;
        let mut query = sqlx::query(sqlx::AssertSqlSafe($sql));
        for bind in $binds {
            query = match bind {
                Bind::Text(value) => query.bind(value),
                Bind::OptText(value) => query.bind(value),
                Bind::Int(value) => query.bind(value),
                Bind::OptInt(value) => query.bind(value),
                Bind::Bool(value) => query.bind(value),
            };
        }
        query
    }};
}
pub(super) use bound_query;
