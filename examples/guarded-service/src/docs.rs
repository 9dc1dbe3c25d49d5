//! The routes of the document store. `put_doc` is the guarded write of the library's README
//! (`fencelock/README.md`, *A guarded write*), as it is there; `tests/readme.rs` checks
//! that the two stay the same.

// For `get_doc` and the routes, below the README's code.
use fencelock::http::{self, ApiError};

// The README's guarded write from here, its imports first.
use actix_web::{HttpResponse, web};
use deadpool_postgres::Pool;
use fencelock::guard::postgres::{classify, classify_pool};
use fencelock::guard::{self, Admission, FencingToken, Guard, GuardError};

/// `PUT /docs/{key}`: the body is written only if the writer's fence is not stale.
async fn put_doc(
    key: web::Path<String>,
    token: FencingToken, // the `Fencing-Token` header: 428 when missing
    body: String,
    guard: web::Data<Guard>,
    pool: web::Data<Pool>,
) -> Result<HttpResponse, GuardError> {
    // 400 (not a fence) or 403 (not signed for this key) before any database work.
    let fence = guard.check(&key, &token)?;
    let mut client = pool.get().await.map_err(classify_pool)?;
    let tx = client.transaction().await.map_err(classify)?;
    // Holds the key's guard row until the transaction ends: check and write are one step.
    let admission = guard::postgres::admit(&tx, &fence, guard.metrics()).await?;
    if let Admission::Stale { current } = admission {
        return Err(guard::stale_write(&key, current)); // 409, nothing written
    }
    tx.execute(
        "INSERT INTO docs (key, body) VALUES ($1, $2)
         ON CONFLICT (key) DO UPDATE SET body = EXCLUDED.body",
        &[&key.as_str(), &body],
    )
    .await
    .map_err(classify)?;
    tx.commit().await.map_err(classify)?;
    Ok(HttpResponse::NoContent().finish())
}

/// `GET /docs/{key}`: the document as last written, `404 not-found` if none was. Reading
/// needs no fence.
async fn get_doc(key: web::Path<String>, pool: web::Data<Pool>) -> Result<HttpResponse, ApiError> {
    let client = pool.get().await.map_err(classify_pool)?;
    let row = client
        .query_opt("SELECT body FROM docs WHERE key = $1", &[&key.as_str()])
        .await
        .map_err(classify)?
        .ok_or_else(|| ApiError::NotFound(format!("no document {}", key.as_str())))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body(row.get::<_, String>(0)))
}

/// The document routes; any other method answers `405`.
pub(crate) fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        http::resource("/docs/{key}", "GET, PUT")
            .route(web::put().to(put_doc))
            .route(web::get().to(get_doc)),
    );
}
