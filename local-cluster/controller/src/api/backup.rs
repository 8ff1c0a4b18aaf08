//! `GET /v1/store/backup` (admin): every stored record at one moment, as the backup file
//! of `xced store backup` (`xce_store::backup`). The running controller holds its redb
//! file exclusively, so a consistent copy is taken here, in one read transaction of the
//! store it writes (one revision, on etcd), while it keeps serving.

use super::state::{internal, ApiState};
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use plugin_api::{ApiError, Principal};
use tracing::info;

pub(super) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/store/backup", get(backup))
        .with_state(state)
}

async fn backup(State(st): State<ApiState>, who: Principal) -> Result<Response, ApiError> {
    if !who.is_admin() {
        return Err(ApiError::forbidden(
            "a backup holds every project's records: it needs the admin permission",
        ));
    }
    let store = st.store.clone();
    let source = st.store_kind;
    let file = tokio::task::spawn_blocking(move || {
        let records = store.load_all().map_err(|e| e.to_string())?;
        let taken_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let file =
            xce_store::backup::encode(&records, source, taken_at).map_err(|e| e.to_string())?;
        Ok::<_, String>((records.len(), file))
    })
    .await
    .map_err(|e| internal(&format!("the backup task failed: {e}")))?;
    let (records, file) = file.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("cannot read the store for a backup: {e}"),
        )
    })?;
    info!(principal = %who.name, records, bytes = file.len(), "store backup taken");
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], file).into_response())
}
