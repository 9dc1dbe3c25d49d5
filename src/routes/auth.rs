//! Bearer tokens on the lock routes (see [`crate::auth`]), in the contract's order:
//!
//! 1. [`authenticate`], a middleware around every lock route, answers `401 unauthorized`
//!    (with `WWW-Authenticate: Bearer`) to a request without a known token, before its body
//!    is read or its path parsed;
//! 2. the handler applies the input rules (`415`, `413`, `400`, `422`);
//! 3. then [`Caller::allow`]: the resource must lie inside the token's prefixes and the token
//!    must have the operation's permission, else `403 forbidden-scope`;
//! 4. the token's quota is kept by the store, atomically with the grant (`429`).
//!
//! Without `--auth-file` every request passes, and leases record no token.

use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{Error, FromRequest, HttpMessage as _, HttpRequest, web};
use prometheus::IntCounterVec;

use crate::auth::{Auth, Permission, Token};
use fencelock::domain::{ListScope, ResourceName, ResourcePrefix, TokenQuota};
use fencelock::http::ApiError;
use fencelock::metrics::{self, Registry, label};

/// The tokens in force (none: authentication is off) and the count of refusals.
pub(crate) struct Gate {
    auth: Option<Arc<Auth>>,
    failures: IntCounterVec,
}

impl Gate {
    pub(crate) fn new(auth: Option<Arc<Auth>>, registry: &Registry) -> Self {
        let failures = metrics::counter(registry, &metrics::AUTH_FAILURES);
        if auth.is_some() {
            // Shown from the start, at 0, when there is something to refuse.
            for reason in label::reason::ALL {
                failures.with_label_values(&[reason]);
            }
        }
        Self { auth, failures }
    }

    pub(crate) fn refused(&self, reason: &str) {
        self.failures.with_label_values(&[reason]).inc();
    }
}

/// The secret of an `Authorization: Bearer <secret>` header, if there is one.
fn bearer(req: &ServiceRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, secret) = value.trim().split_once(' ')?;
    let secret = secret.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !secret.is_empty()).then_some(secret)
}

/// Lets a request with a known bearer token through (the token goes into the request's
/// extensions for [`Caller`]); answers any other `401`. Nothing of the secret is logged.
pub(crate) async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let gate = req.app_data::<web::Data<Gate>>().cloned();
    let Some(auth) = gate.as_ref().and_then(|g| g.auth.clone()) else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    };
    let refusal = match bearer(&req) {
        None => (
            label::reason::MISSING,
            "this request needs a bearer token (Authorization: Bearer <secret>)",
        ),
        Some(secret) => match auth.lookup(secret) {
            Some(token) => {
                req.extensions_mut().insert(token);
                return next
                    .call(req)
                    .await
                    .map(ServiceResponse::map_into_left_body);
            }
            None => (label::reason::UNKNOWN, "the bearer token is not known here"),
        },
    };
    if let Some(gate) = gate {
        gate.refused(refusal.0);
    }
    Ok(req
        .error_response(ApiError::Unauthorized(refusal.1.to_owned()))
        .map_into_right_body())
}

/// Who is asking: the token the request came with, or nobody when authentication is off.
pub(crate) struct Caller {
    token: Option<Arc<Token>>,
    gate: Option<web::Data<Gate>>,
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        let gate = req.app_data::<web::Data<Gate>>().cloned();
        let token = req.extensions().get::<Arc<Token>>().cloned();
        let on = gate.as_ref().is_some_and(|g| g.auth.is_some());
        std::future::ready(if on && token.is_none() {
            // Only a route registered without `authenticate` gets here.
            Err(ApiError::Unauthorized(
                "this request needs a bearer token (Authorization: Bearer <secret>)".to_owned(),
            ))
        } else {
            Ok(Self { token, gate })
        })
    }
}

impl Caller {
    /// `403 forbidden-scope` unless the token may do `permission` on `resource`.
    pub(crate) fn allow(
        &self,
        resource: &ResourceName,
        permission: Permission,
    ) -> Result<(), ApiError> {
        let Some(token) = &self.token else {
            return Ok(());
        };
        let why = if !token.covers(resource) {
            format!("this token may not touch {resource}: it is outside the token's prefixes")
        } else if !token.has(permission) {
            format!(
                "this token lacks the {} permission this operation needs",
                permission.as_str()
            )
        } else {
            return Ok(());
        };
        self.refused(label::reason::SCOPE);
        Err(ApiError::ForbiddenScope(why))
    }

    /// What a list asking for `requested` may show: the names that start with it and with
    /// one of the token's prefixes, so that a page is filled from those names alone. `403
    /// forbidden-scope` if the token lacks `read`, or if no name could be both: a list of
    /// names the token may not see would look empty whether or not leases are held there,
    /// and an empty page must not pass for "none held" (inspect answers `403` the same way).
    pub(crate) fn list_scope(&self, requested: ResourcePrefix) -> Result<ListScope, ApiError> {
        let Some(token) = &self.token else {
            return Ok(ListScope::whole(requested));
        };
        if !token.has(Permission::Read) {
            self.refused(label::reason::SCOPE);
            return Err(ApiError::ForbiddenScope(
                "this token lacks the read permission listing needs".to_owned(),
            ));
        }
        // The auth file's prefixes are checked against the same character set when it is read.
        let allowed: Vec<ResourcePrefix> = token
            .prefixes()
            .iter()
            .filter_map(|prefix| ResourcePrefix::parse(prefix).ok())
            .collect();
        ListScope::within(&requested, &allowed).ok_or_else(|| {
            self.refused(label::reason::SCOPE);
            ApiError::ForbiddenScope(format!(
                "this token may not list names starting with {:?}: they are outside the token's prefixes",
                requested.as_str()
            ))
        })
    }

    /// The token's name, for the log line of each lease event.
    pub(crate) fn name(&self) -> Option<&str> {
        self.token.as_deref().map(Token::name)
    }

    /// What the store records and counts for an acquisition by this caller.
    pub(crate) fn quota(&self) -> Option<TokenQuota> {
        self.token.as_deref().map(|token| TokenQuota {
            name: token.name().to_owned(),
            max_leases: token.max_leases(),
        })
    }

    /// The `429` for an acquisition the store refused by quota.
    pub(crate) fn quota_exceeded(&self, max_leases: u32) -> ApiError {
        self.refused(label::reason::QUOTA);
        ApiError::QuotaExceeded(format!(
            "this token holds its limit of {max_leases} live lease(s); release one before acquiring another"
        ))
    }

    fn refused(&self, reason: &str) {
        if let Some(gate) = &self.gate {
            gate.refused(reason);
        }
    }
}
