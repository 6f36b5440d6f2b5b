mod common;
use ruled::store::Store;
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn probe() {
    let db = common::sqlite_db().await;
    let store = db.store().await;
    let Store::Sqlite(pool) = &store else {
        panic!()
    };
    sqlx::query("CREATE TABLE p (id TEXT PRIMARY KEY, v INTEGER)")
        .execute(pool)
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    for i in 0..5000 {
        sqlx::query("INSERT INTO p VALUES ($1, $2)")
            .bind(format!("{i:08}"))
            .bind(0i64)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    for round in 0..3 {
        let t = Instant::now();
        let mut tx = pool.begin().await.unwrap();
        for i in 0..5000 {
            sqlx::query("UPDATE p SET v = v + 1 WHERE id = $1")
                .bind(format!("{i:08}"))
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        println!(
            "round {round}: 5000 updates in one tx: {:?} ({:?}/stmt)",
            t.elapsed(),
            t.elapsed() / 5000
        );
        let t = Instant::now();
        let mut conn = pool.acquire().await.unwrap();
        for _ in 0..5000 {
            sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
        }
        println!(
            "round {round}: 5000 SELECT 1: {:?}/stmt",
            t.elapsed() / 5000
        );
        let t = Instant::now();
        for i in 0..500 {
            sqlx::query("UPDATE p SET v = v + 1 WHERE id = $1")
                .bind(format!("{i:08}"))
                .execute(pool)
                .await
                .unwrap();
        }
        println!(
            "round {round}: 500 autocommit updates: {:?}/stmt",
            t.elapsed() / 500
        );
    }
}
