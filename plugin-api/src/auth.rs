//! The apiserver's extension points: routes, and the authentication and authorization
//! that extensions call. Also the one error shape every REST answer uses.

use http::StatusCode;
use std::sync::Arc;
use tokio::sync::watch;

/// A permission a token may be granted (docs/rbac.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Permission {
    /// See a project's services, jobs and endpoints.
    #[serde(rename = "job.view")]
    JobView,
    /// Submit and stop a project's services.
    #[serde(rename = "job.submit")]
    JobSubmit,
    /// Everything, including host-scoped data.
    #[serde(rename = "admin")]
    Admin,
    /// Read `/metrics` (cluster-wide: granted on `["*"]`). Its labels name every
    /// tenant's projects and services, so it is not every token's.
    #[serde(rename = "metrics.view")]
    MetricsView,
    /// Read `GET /v1/hosts` (cluster-wide: granted on `["*"]`): every host's addresses
    /// and job counts, across tenants.
    #[serde(rename = "host.view")]
    HostView,
}

impl Permission {
    /// Its name in a tokens file and in refusals.
    pub fn name(self) -> &'static str {
        match self {
            Permission::JobView => "job.view",
            Permission::JobSubmit => "job.submit",
            Permission::Admin => "admin",
            Permission::MetricsView => "metrics.view",
            Permission::HostView => "host.view",
        }
    }

    /// Whether it applies to the whole cluster rather than to projects (granted on
    /// `["*"]` only).
    pub fn cluster_wide(self) -> bool {
        matches!(self, Permission::MetricsView | Permission::HostView)
    }
}

/// Who a principal is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrincipalKind {
    /// A person or script with grants.
    User,
    /// A worker agent: may report for this one host only, and read nothing else.
    Worker {
        /// The host the credential belongs to.
        host: String,
    },
}

/// An authenticated caller and what it may do.
#[derive(Debug, Clone)]
pub struct Principal {
    /// Its name (for logs and per-principal limits). Never the secret.
    pub name: String,
    /// User or worker.
    pub kind: PrincipalKind,
    /// `(permission, projects)` pairs; `"*"` in projects means all projects.
    pub grants: Vec<(Permission, Vec<String>)>,
    /// The credential it authenticated with, followed across reloads of the host's
    /// tokens: long requests (streams, blocking queries) end when it is revoked.
    pub credential: Credential,
}

/// A credential's grants as the host holds them now: `None` once it is removed.
pub type LiveGrants = Option<Arc<Vec<(Permission, Vec<String>)>>>;

/// The credential behind a [`Principal`], followed after the request authenticated: the
/// host re-reads its tokens (SIGHUP) and a removed credential, or one whose grants shrank,
/// must stop being served, also on requests that are already open.
///
/// **Who uses it**: a handler of a long request (a stream, a blocking query) selects on
/// [`lost`](Self::lost) (or [`removed`](Self::removed) when it filters by project
/// itself) next to its own wake-ups, and ends the request when it resolves. Nothing polls:
/// it is a watch channel the host writes when it reloads. The default (tests, a host
/// that never reloads) is never revoked.
#[derive(Clone, Default)]
pub struct Credential(Option<watch::Receiver<LiveGrants>>);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.0 {
            None => "Credential(fixed)",
            Some(_) => "Credential(live)",
        })
    }
}

// === impl Credential ===

impl Credential {
    /// A credential that is never revoked.
    pub fn fixed() -> Self {
        Self(None)
    }

    /// A credential whose grants the host publishes on `rx` (`None` once removed).
    pub fn following(rx: watch::Receiver<LiveGrants>) -> Self {
        Self(Some(rx))
    }

    /// Whether the host still holds the credential, with grants allowing `permission`
    /// on `project`.
    pub fn allows(&self, permission: Permission, project: &str) -> bool {
        match &self.0 {
            None => true,
            Some(rx) => allows(&rx.borrow(), permission, project),
        }
    }

    /// The credential's grants as the host holds them now (`Some(None)`: removed), or
    /// `None` for a fixed credential, which the host does not follow. A read of the watch
    /// channel: a long request compares it instead of authenticating its token again.
    pub fn current(&self) -> Option<LiveGrants> {
        self.0.as_ref().map(|rx| rx.borrow().clone())
    }

    /// Whether the host has removed the credential.
    pub fn is_removed(&self) -> bool {
        self.0.as_ref().is_some_and(|rx| rx.borrow().is_none())
    }

    /// Resolves once the credential is removed, or its grants no longer allow
    /// `permission` on `project`; never, if neither happens.
    pub async fn lost(&self, permission: Permission, project: &str) {
        self.until(|g| !allows(g, permission, project)).await
    }

    /// Resolves once the credential is removed; never, if it is not.
    pub async fn removed(&self) {
        self.until(Option::is_none).await
    }

    /// What a long request answers when [`lost`](Self::lost) resolved: 401 `revoked` for
    /// a removed credential; for one that may no longer view `name`, the same 404 as a
    /// service that does not exist (no existence oracle).
    pub fn lost_answer(&self, name: &str) -> ApiError {
        if self.is_removed() {
            ApiError::unauthenticated(AuthError::Revoked)
        } else {
            ApiError::service_not_found(name)
        }
    }

    async fn until(&self, gone: impl Fn(&LiveGrants) -> bool) {
        let Some(rx) = &self.0 else {
            return std::future::pending().await;
        };
        let mut rx = rx.clone();
        // The host dropped the channel (it stops): what it said last stands.
        if rx.wait_for(|g| gone(g)).await.is_err() && !gone(&rx.borrow()) {
            std::future::pending::<()>().await;
        }
    }
}

fn allows(grants: &LiveGrants, permission: Permission, project: &str) -> bool {
    grants
        .as_ref()
        .is_some_and(|g| grants_allow(g, permission, project))
}

/// Whether `grants` hold `permission` on `project`; `admin` implies the others.
fn grants_allow(
    grants: &[(Permission, Vec<String>)],
    permission: Permission,
    project: &str,
) -> bool {
    grants.iter().any(|(p, projects)| {
        (*p == permission || *p == Permission::Admin)
            && projects.iter().any(|pr| pr == "*" || pr == project)
    })
}

impl Principal {
    /// Whether the principal holds `permission` on `project`. `admin` implies the others.
    pub fn may(&self, permission: Permission, project: &str) -> bool {
        grants_allow(&self.grants, permission, project)
    }

    /// Whether the principal is an admin on every project.
    pub fn is_admin(&self) -> bool {
        self.may(Permission::Admin, "*")
    }
}

/// Why a request could not be authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("missing bearer token")]
    Missing,
    /// A token that matches no principal.
    #[error("invalid bearer token")]
    Invalid,
    /// The token was removed from the host's tokens while a request of it was open.
    #[error("bearer token revoked")]
    Revoked,
}

/// Turns a bearer token into a principal. Implemented by the host (tokens file, worker
/// credentials); extensions never see secrets.
///
/// **Who calls it**: the [`Principal`] extractor, once per request. Must compare secrets
/// in constant time and never log them.
pub trait Authenticator: Send + Sync + 'static {
    /// Authenticates `token` (the text after `Bearer `), or `None` if absent.
    fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError>;
}

/// What the host lends an extension when it mounts its routes.
#[derive(Clone)]
pub struct ApiContext {
    /// The host's authenticator. The host also installs it as a request extension, so the
    /// [`Principal`] extractor works in extension handlers.
    pub auth: Arc<dyn Authenticator>,
}

impl std::fmt::Debug for ApiContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiContext").finish_non_exhaustive()
    }
}

impl ApiContext {
    /// A context whose authenticator accepts the listed `(secret, principal)` pairs.
    pub fn for_test(tokens: Vec<(String, Principal)>) -> Self {
        struct Fixed(Vec<(String, Principal)>);
        impl Authenticator for Fixed {
            fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
                let token = token.ok_or(AuthError::Missing)?;
                self.0
                    .iter()
                    .find(|(s, _)| s == token)
                    .map(|(_, p)| p.clone())
                    .ok_or(AuthError::Invalid)
            }
        }
        Self {
            auth: Arc::new(Fixed(tokens)),
        }
    }
}

/// The error every REST answer uses, sent as an [`ErrorBody`](crate::error_body::ErrorBody):
/// `{"error": {"code": "...", "details": [...], "message": "..."}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine code, e.g. `not_found`.
    pub code: &'static str,
    /// Human message, lowercase.
    pub message: String,
    /// Per-field problems, when any.
    pub details: Vec<crate::vocab::FieldError>,
}

impl ApiError {
    /// Builds an error.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }
    /// The one 404 for a service that does not exist **or** that the caller may not view:
    /// both answers are byte-identical, so there is no existence oracle.
    pub fn service_not_found(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("service {name:?} not found"),
        )
    }
    /// 409 for a service name that several projects the caller may view have; lists only
    /// those projects (the caller's own), so nothing is told of anyone else's.
    pub fn ambiguous_service(name: &str, projects: &[String]) -> Self {
        Self {
            details: projects
                .iter()
                .map(|p| crate::vocab::FieldError::new("project", format!("{p:?} has a service {name:?}")))
                .collect(),
            ..Self::new(
                StatusCode::CONFLICT,
                "ambiguous",
                format!(
                    "service {name:?} exists in several of your projects ({}); pick one with ?project=",
                    projects.join(", ")
                ),
            )
        }
    }
    /// 401.
    pub fn unauthenticated(err: AuthError) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthenticated", err.to_string())
    }
    /// 403, for actions on objects the caller may see but not change.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }
    /// 400 with every field problem.
    pub fn invalid(message: impl Into<String>, details: Vec<crate::vocab::FieldError>) -> Self {
        Self {
            details,
            ..Self::new(StatusCode::BAD_REQUEST, "invalid", message)
        }
    }
    /// 400 for a bad query parameter.
    pub fn bad_param(field: &str, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        Self::invalid(
            format!("{field}: {reason}"),
            vec![crate::vocab::FieldError::new(field, reason)],
        )
    }
}

// Here, not in `error_body`: the body is the lower layer, the error is written into it.
impl From<ApiError> for crate::error_body::ErrorBody {
    fn from(e: ApiError) -> Self {
        Self {
            error: crate::error_body::ErrorInfo {
                code: e.code.to_owned(),
                details: e.details,
                message: e.message,
            },
        }
    }
}
