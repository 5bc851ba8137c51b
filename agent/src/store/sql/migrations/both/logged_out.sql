-- Browsers' logins that were logged out, by their login cookie's id, until that cookie expires anyway: every
-- instance refuses such a cookie. An older version leaves the table alone, and accepts the cookies it reads.
CREATE TABLE logged_out (
    login TEXT PRIMARY KEY,
    expires_at BIGINT NOT NULL
);
