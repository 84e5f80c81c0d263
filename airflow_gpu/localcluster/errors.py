"""API errors as the real API server reports them: always a `Status` object with reason and code."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        # details always present (at least {}): clients such as `kubectl debug` dereference it unchecked
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details or {}, "code": self.code}


def status_success(code: int = 200, details: dict | None = None) -> dict:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}
    if details:
        body["details"] = details
    return body


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(404, "NotFound", f'{_qualified(plural, group)} "{name}" not found',
                    {"name": name, "group": group, "kind": plural})


def no_such_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(409, "AlreadyExists", f'{_qualified(plural, group)} "{name}" already exists',
                    {"name": name, "group": group, "kind": plural})


def conflict(plural: str, name: str, group: str = "", why: str | None = None) -> ApiError:
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {why}',
                    {"name": name, "group": group, "kind": plural})


def forbidden(plural: str, name: str, why: str, group: str = "") -> ApiError:
    return ApiError(403, "Forbidden", f'{_qualified(plural, group)} "{name}" is forbidden: {why}',
                    {"name": name, "group": group, "kind": plural})


def invalid(kind: str, name: str, causes: list[tuple[str, str, str]], group: str = "") -> ApiError:
    """causes: (field, reason, message) with reason FieldValueRequired / FieldValueInvalid / ..."""
    text = "; ".join(f"{field}: {message}" for field, _, message in causes)
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {text}', {
        "name": name, "group": group, "kind": kind,
        "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes],
    })


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def method_not_allowed(verb: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", f"the server does not allow this method on the requested resource ({verb})")


def request_too_large(message: str) -> ApiError:
    return ApiError(413, "RequestEntityTooLarge", f"Request entity too large: {message}")


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def unsupported_media_type(ctype: str) -> ApiError:
    return ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got "{ctype}")')
