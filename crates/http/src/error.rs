//! The one error shape of the API: `{error_code, error_msg, command, task, stage}`,
//! its `error_code` one of the library's [`ErrorCode`]s.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use taskstage::{ErrorCode, Stage};

/// An answer that is not a success: its status and the JSON body that explains it.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: ErrorCode,
    pub(crate) msg: String,
    pub(crate) command: Option<&'static str>,
    pub(crate) task: Option<String>,
    pub(crate) stage: Option<String>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: ErrorCode, msg: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            msg: msg.into(),
            command: None,
            task: None,
            stage: None,
        }
    }

    pub(crate) fn command(mut self, command: &'static str) -> Self {
        self.command = Some(command);
        self
    }

    pub(crate) fn task(mut self, task: &str) -> Self {
        self.task = Some(task.to_owned());
        self
    }

    pub(crate) fn stage(mut self, stage: Option<Stage>) -> Self {
        self.stage = stage.map(|s| s.name().to_owned());
        self
    }

    pub(crate) fn bad_request(msg: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, msg)
    }

    pub(crate) fn unknown_task(task: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownTask,
            format!("task {task:?} does not exist"),
        )
        .task(task)
    }

    pub(crate) fn not_available(what: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotAvailable,
            what.to_owned(),
        )
    }

    pub(crate) fn body(&self) -> Value {
        json!({
            "error_code": self.code.as_str(),
            "error_msg": self.msg,
            "command": self.command,
            "task": self.task,
            "stage": self.stage,
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(self.status, &self.body())
    }
}

/// A JSON answer with `status`.
pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
