//! The lease server's wire vocabulary for its OpenAPI document: the shapes of the paths,
//! queries and bodies the handlers read (the handlers' parsers, `routes::parse`, read them
//! field by field), and the problem answers of each operation. The handlers name these in
//! their `#[utoipa::path]`; [`super::openapi`] assembles the document from them.

use fencelock::http::ApiError;
use fencelock::http::openapi::{ResourceNameSchema, body_refusals, invalid_input, store_failures};

/// An owner: no control characters, and something besides whitespace. (Stricter than the
/// rule in one way: surrounding whitespace control characters such as a tab are trimmed by
/// the server, but a client has no reason to send them.)
const OWNER_PATTERN: &str =
    r"^[^\x00-\x1F\x7F-\x9F]*[^\s\x00-\x1F\x7F-\x9F][^\x00-\x1F\x7F-\x9F]*$";

fn owner_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .description(Some(
            "The caller's secret token for this acquisition (e.g. a UUID); surrounding \
             whitespace is trimmed, then 1-255 bytes without control characters.",
        ))
        .min_length(Some(1))
        .max_length(Some(255))
        .pattern(Some(OWNER_PATTERN))
        .build()
}

/// The path parameter of every lock route.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct ResourcePath {
    /// The locked thing's name: 1-255 characters of `A-Z a-z 0-9 . _ - : @ + = ~`, not `.`
    /// or `..`. Anything else is `422`.
    #[param(value_type = ResourceNameSchema, inline)]
    resource: String,
}

/// The query of `GET /locks`. Any other parameter, or one given twice, is `422`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct ListParams {
    /// Only names that start with this: 0-255 characters of `A-Z a-z 0-9 . _ - : @ + = ~`
    /// (absent or empty: every name). With a bearer token, only names inside the token's
    /// prefixes are listed; a prefix that no name inside them can start with is `403
    /// forbidden-scope`.
    #[param(max_length = 255, pattern = r"^[A-Za-z0-9._:@+=~-]{0,255}$")]
    prefix: Option<String>,
    /// Most leases on the page: 1-1000, default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next` of the previous page: the page lists the names after this one.
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = r"^(?!\.\.?$)[A-Za-z0-9._:@+=~-]{1,255}$"
    )]
    after: Option<String>,
}

/// The query of `GET /locks/{resource}/history`. Any other parameter, or one given twice, is
/// `422`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct HistoryParams {
    /// Most leases listed, newest first: 1-1000, default 50.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

/// The query of `GET /locks/{resource}/watch`. Any other parameter, or one given twice, is
/// `422`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct WatchParams {
    /// The fence of the lease to wait for the end of. Absent: answer at once with the live
    /// lease (`changed: false`).
    #[param(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    fence: Option<i64>,
    /// Longest wait, in milliseconds: 1-300000, default 30000. Then the answer is
    /// `changed: false` with the live lease.
    #[param(minimum = 1, maximum = 300000)]
    timeout_ms: Option<u32>,
}

/// The body of `POST /locks/{resource}`. Unknown fields are `422`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct AcquireBody {
    /// The caller's secret token for this acquisition (e.g. a UUID); trimmed, then 1-255
    /// bytes without control characters.
    #[schema(schema_with = owner_schema)]
    owner: String,
    /// The lease's time to live, from 1 to the server's maximum (`--max-ttl-seconds`).
    #[schema(minimum = 1, maximum = 86400)]
    ttl_seconds: i64,
    /// Milliseconds, 0-60000 (default 0): when this lease ends by expiry (not by release), no
    /// other owner can acquire the resource until this long after its `expires_at`
    /// (`acquired: false`); its own owner still can. Kept by renewals; a re-acquisition
    /// takes the new request's value.
    #[schema(minimum = 0, maximum = 60000, default = 0)]
    lock_delay_ms: Option<i64>,
    /// While another owner holds the resource (or others wait for it), wait up to this many
    /// milliseconds for it, in arrival order with every other waiter: 0 (the default: answer
    /// at once) to the server's maximum (`--max-wait-ms`). Then answer as without it.
    #[schema(minimum = 0, maximum = 60000)]
    wait_ms: Option<i64>,
}

/// The body of `POST /locks/{resource}/renew`. Unknown fields are `422`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct RenewBody {
    /// The owner the lease was acquired with.
    #[schema(schema_with = owner_schema)]
    owner: String,
    /// The new time to live, from now: 1 to the server's maximum.
    #[schema(minimum = 1, maximum = 86400)]
    ttl_seconds: i64,
    /// When given, the lease's fence must be this one (`409 stale-fence` otherwise).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    fence: Option<i64>,
}

/// The body of `DELETE /locks/{resource}` and `POST /locks/{resource}/release`. Unknown
/// fields are `422`.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[expect(
    dead_code,
    reason = "the wire shape, for the document; routes::parse reads it"
)]
pub(crate) struct ReleaseBody {
    /// The owner the lease was acquired with.
    #[schema(schema_with = owner_schema)]
    owner: String,
    /// When given, the lease's fence must be this one (`409 stale-fence` otherwise).
    #[schema(minimum = 1, maximum = 9_007_199_254_740_991_i64)]
    fence: Option<i64>,
}

// The problem answers of each operation, beyond those of the HTTP layer.
fencelock::problem_answers! {
    AcquireProblems => lock_problems(with_body(vec![ApiError::QuotaExceeded(String::new())]));
    InspectProblems => lock_problems(vec![
        ApiError::NotFound(String::new()),
        ApiError::Delayed { detail: String::new(), until: chrono::DateTime::UNIX_EPOCH },
    ]);
    ReleaseProblems => lock_problems(with_body(holder_refusals(vec![
        ApiError::Forbidden(String::new()),
    ])));
    RenewProblems => lock_problems(with_body(holder_refusals(vec![
        ApiError::LeaseExpired(String::new()),
        ApiError::OwnerMismatch(String::new()),
    ])));
    ListProblems => lock_problems(Vec::new());
    HistoryProblems => lock_problems(Vec::new());
    WatchProblems => lock_problems(Vec::new());
    ReadyProblems => vec![ApiError::NotReady(String::new())];
}

/// The problems of a lock operation: with `--auth-file`, no or an unknown bearer token (`401`,
/// before anything else) and a resource or operation outside the token's scope (`403`
/// forbidden-scope, ahead of the operation's own `403`); a field that breaks the input rules
/// (`422`); its `own`; and a store that cannot answer.
fn lock_problems(own: Vec<ApiError>) -> Vec<ApiError> {
    let auth = vec![
        ApiError::Unauthorized(String::new()),
        ApiError::ForbiddenScope(String::new()),
    ];
    [auth, vec![invalid_input()], own, store_failures()]
        .into_iter()
        .flatten()
        .collect()
}

/// `own` and the refusals of a JSON request body.
fn with_body(own: Vec<ApiError>) -> Vec<ApiError> {
    body_refusals().into_iter().chain(own).collect()
}

/// The holder's checks of renew and release, in the contract's order: no lease (`404`), then
/// the operation's `own`, then a fence that is not the lease's (`409 stale-fence`).
fn holder_refusals(own: Vec<ApiError>) -> Vec<ApiError> {
    let mut refusals = vec![ApiError::NotFound(String::new())];
    refusals.extend(own);
    refusals.push(stale_fence());
    refusals
}

fn stale_fence() -> ApiError {
    ApiError::StaleFence {
        detail: String::new(),
        current_fence: None,
    }
}
