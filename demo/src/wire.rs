//! The demo store's wire vocabulary for its OpenAPI document (assembled in [`crate::app`],
//! like the lease server's, see `fencelock::http::openapi`): the shapes of the paths,
//! headers, queries and answers its handlers read and write field by field, and the problem
//! answers of each operation. Below the handlers of [`crate::app`] and [`crate::page`], which
//! name these in their `#[utoipa::path]`.

use chrono::SecondsFormat;
use fencelock::http::ApiError;
use fencelock::http::openapi::{ResourceNameSchema, body_refusals, invalid_input, store_failures};
use serde_json::Value;

use crate::docs::Outcome;

/// The `{key}` path parameter: the lock resource that protects the document.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; app::key reads it"
)]
pub struct KeyPath {
    /// 1-255 characters of `A-Z a-z 0-9 . _ - : @ + = ~`, not `.` or `..` (the lease
    /// server's resource rules). Anything else is `422`.
    #[param(value_type = ResourceNameSchema, inline)]
    key: String,
}

/// The `Fencing-Token` header of a write.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; the guard reads it"
)]
pub struct FencingTokenHeader {
    /// The writer's lease. A store with fence keys takes only the lease's `fence_token`
    /// (`<fence>.<signature>`, signed for this key): a bare fence or a token not signed for
    /// this key is `403 invalid-fence-token`. A store without keys takes the fence, a
    /// positive integer below 2^53. What is no token at all: `400`. Missing: `428`.
    #[param(rename = "Fencing-Token", pattern = r"^[0-9]+(\.[A-Za-z0-9_-]{43})?$")]
    fencing_token: String,
}

/// The page parameters of `GET /docs/{key}/writes`; any other parameter is `422`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; app::page reads it"
)]
pub struct PageQuery {
    /// Most writes on the page: 1-1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next` of the previous page; absent or `0`: from the start.
    #[param(minimum = 0)]
    after: Option<i64>,
}

/// An applied write.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; app::put_doc writes it"
)]
pub struct Applied {
    key: String,
    /// The value as written: any JSON value.
    value: Value,
    #[schema(minimum = 1)]
    fence: i64,
}

/// A document.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; app::get_doc writes it"
)]
pub struct Document {
    key: String,
    value: Value,
    /// The fence of the write that wrote it.
    #[schema(minimum = 1)]
    fence: i64,
    /// RFC 3339 UTC, millisecond precision.
    #[schema(format = DateTime)]
    updated_at: String,
}

/// One page of a key's write log, oldest first.
#[derive(utoipa::ToSchema)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; app::list_writes writes it"
)]
pub struct WritesPage {
    writes: Vec<WriteRecord>,
    /// The `after` of the next page; `null` on the last page.
    #[schema(required = true)]
    next: Option<i64>,
}

/// One write attempt, applied or rejected: an entry of a write-log page, and of the page's
/// view of a run.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct WriteRecord {
    #[schema(minimum = 1)]
    id: i64,
    #[schema(minimum = 1)]
    fence: i64,
    outcome: Outcome,
    /// RFC 3339 UTC, millisecond precision.
    #[schema(format = DateTime)]
    at: String,
}

impl From<&crate::docs::WriteRecord> for WriteRecord {
    fn from(w: &crate::docs::WriteRecord) -> Self {
        Self {
            id: w.id,
            fence: w.fence,
            outcome: w.outcome,
            at: w.at.to_rfc3339_opts(SecondsFormat::Millis, true),
        }
    }
}

// The problem answers of each operation, beyond those of the HTTP layer.
fencelock::problem_answers! {
    PutProblems => [
        body_refusals(),
        vec![
            ApiError::FencingTokenRequired(String::new()),
            ApiError::InvalidFenceToken(String::new()),
            invalid_input(),
            fencelock::guard::stale_write("", fencelock::domain::Fence::new(1).expect("a fence")).into(),
        ],
        store_failures(),
    ].into_iter().flatten();
    GetProblems => [
        vec![invalid_input(), ApiError::NotFound(String::new())],
        store_failures(),
    ].into_iter().flatten();
    WritesProblems => [vec![invalid_input()], store_failures()].into_iter().flatten();
    StateProblems => [vec![invalid_input()], store_failures()].into_iter().flatten();
    PlayProblems => [
        body_refusals(),
        vec![
            invalid_input(),
            ApiError::QuotaExceeded(String::new()),
            ApiError::Internal(anyhow::anyhow!("")),
        ],
    ].into_iter().flatten();
}
