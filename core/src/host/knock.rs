//! The signature double-knock of one attempt (OL-22): which HTTP signature scheme signs each
//! request of the attempt, and whether a refusal is sent again.
//!
//! The [`HostBook`](super::HostBook) gives each attempt a [`KnockPlan`] from what its host
//! is known to accept; the HTTP client drives a [`Knock`] over it — send with
//! [`Knock::spec`], tell it the answer with [`Knock::answered`], send again while it says
//! [`KnockStep::Again`] — and hands its [`KnockReport`] back to the book with the attempt's
//! end, which learns the scheme from it. The rules:
//!
//! - A refusal that means "signature not understood" is 401 or 403 always; 400 (and a 5xx
//!   with [`KnockPlan::on_5xx`]) only while the host's scheme is not known — a host known to
//!   take a scheme that answers 400 refuses the payload, not the signature, and gets nothing
//!   twice.
//! - On such a refusal the other scheme is tried once, inside the attempt, whichever scheme
//!   was known: a success re-learns (symmetric). A host that refused both is offered no second
//!   request for [`HostConfig::knock_retry`](super::HostConfig::knock_retry), so a host that
//!   refuses everything costs about one request per unit.
//! - A refusal carrying an `Accept-Signature` challenge (RFC 9421 §5) that the signer can
//!   honour ([`Challenge::Usable`]) is answered first, once, with an RFC 9421 signature of
//!   what it asks for; one it cannot honour is ignored (an identical request is never sent
//!   again).
//! - At most three requests per attempt: the first, the challenge's, the other scheme's.

/// Which HTTP signature scheme signs a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignatureSpec {
    /// RFC 9421 HTTP Message Signatures (`Signature-Input`, `Signature`, `Content-Digest`).
    Rfc9421,
    /// draft-cavage-http-signatures-12 (`Signature`, `Date`, `Digest`).
    Cavage,
}

impl SignatureSpec {
    /// The scheme's code: `rfc9421` or `cavage`.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureSpec::Rfc9421 => "rfc9421",
            SignatureSpec::Cavage => "cavage",
        }
    }

    /// The scheme of a code [`SignatureSpec::as_str`] gives; `None` for any other text.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "rfc9421" => Some(SignatureSpec::Rfc9421),
            "cavage" => Some(SignatureSpec::Cavage),
            _ => None,
        }
    }

    /// The other scheme.
    pub fn other(self) -> SignatureSpec {
        match self {
            SignatureSpec::Rfc9421 => SignatureSpec::Cavage,
            SignatureSpec::Cavage => SignatureSpec::Rfc9421,
        }
    }
}

/// Which HTTP signature scheme an outbox signs with (`--signature-spec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SignatureMode {
    /// RFC 9421 first for a host not known yet, the other scheme when it refuses, then what
    /// worked (the double-knock). The default.
    #[default]
    Auto,
    /// Always RFC 9421.
    Rfc9421,
    /// Always draft-cavage (what outbox-lanes signed before RFC 9421).
    Cavage,
}

impl SignatureMode {
    /// `auto`, `rfc9421` or `cavage`.
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureMode::Auto => "auto",
            SignatureMode::Rfc9421 => "rfc9421",
            SignatureMode::Cavage => "cavage",
        }
    }

    /// The mode of a code [`SignatureMode::as_str`] gives.
    pub fn from_code(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(SignatureMode::Auto),
            "rfc9421" => Some(SignatureMode::Rfc9421),
            "cavage" => Some(SignatureMode::Cavage),
            _ => None,
        }
    }
}

/// What signs the attempts of an outbox, as far as the double-knock is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signing {
    /// Nothing that follows a scheme (no signer, Standard Webhooks): every request is built
    /// once, with this scheme named (signers that ignore it ignore it).
    Plain(SignatureSpec),
    /// HTTP Signatures in one fixed scheme: no knock, but an `Accept-Signature` challenge is
    /// answered once when the scheme is RFC 9421.
    Fixed(SignatureSpec),
    /// HTTP Signatures with [`SignatureMode::Auto`]: the double-knock.
    Auto,
}

impl Signing {
    /// The signing of an outbox whose signer does HTTP Signatures (`http_signatures`) or not,
    /// in `mode`.
    pub fn of(mode: SignatureMode, http_signatures: bool) -> Signing {
        let fixed = match mode {
            SignatureMode::Auto if http_signatures => return Signing::Auto,
            SignatureMode::Auto | SignatureMode::Rfc9421 => SignatureSpec::Rfc9421,
            SignatureMode::Cavage => SignatureSpec::Cavage,
        };
        if http_signatures {
            Signing::Fixed(fixed)
        } else {
            Signing::Plain(fixed)
        }
    }
}

/// What the host book lets one attempt do: its first scheme, the other one it may try on a
/// refusal, and how refusals are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnockPlan {
    /// The scheme of the first request.
    pub first: SignatureSpec,
    /// The scheme a refusal may be sent again with (`None`: no second scheme).
    pub fallback: Option<SignatureSpec>,
    /// The host's scheme is known (and `first` is it): a 400 or 5xx refuses the payload,
    /// not the signature.
    pub known: bool,
    /// An `Accept-Signature` challenge may be answered.
    pub challenges: bool,
    /// A 5xx to a request whose scheme is not known is read as a refusal of the signature
    /// (`--signature-fallback-on-5xx`).
    pub on_5xx: bool,
}

impl KnockPlan {
    /// A plan that sends one request, signed (if at all) with `spec`.
    pub fn once(spec: SignatureSpec) -> KnockPlan {
        KnockPlan {
            first: spec,
            fallback: None,
            known: true,
            challenges: false,
            on_5xx: false,
        }
    }

    /// The plan for a host nothing is known about, under `signing` (a client with no host
    /// book uses it for every attempt): RFC 9421 first and draft-cavage on a refusal with
    /// [`Signing::Auto`]; one request in the fixed scheme (answering an RFC 9421 challenge)
    /// with [`Signing::Fixed`]; one request with [`Signing::Plain`].
    pub fn unknown(signing: Signing, on_5xx: bool) -> KnockPlan {
        match signing {
            Signing::Plain(spec) => KnockPlan::once(spec),
            Signing::Fixed(spec) => KnockPlan {
                challenges: spec == SignatureSpec::Rfc9421,
                ..KnockPlan::once(spec)
            },
            Signing::Auto => KnockPlan {
                first: SignatureSpec::Rfc9421,
                fallback: Some(SignatureSpec::Cavage),
                known: false,
                challenges: true,
                on_5xx,
            },
        }
    }
}

/// Whether the refusal of a request carried an `Accept-Signature` challenge, and whether the
/// signer can honour it (its components, algorithm and key).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Challenge {
    /// No challenge.
    None,
    /// A challenge the signer can sign as asked.
    Usable,
    /// A challenge the signer cannot honour (garbage, unknown components, another key or
    /// algorithm): ignored.
    Unusable,
}

/// What to do after an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnockStep {
    /// Send the request again, signed with `spec`, answering the challenge if `challenge`.
    Again {
        /// The scheme of the next request.
        spec: SignatureSpec,
        /// The next request answers the last answer's `Accept-Signature`.
        challenge: bool,
    },
    /// The last answer is the attempt's.
    Done,
}

/// What an attempt's knock taught, for [`HostBook::handle_end`](super::HostBook::handle_end).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnockReport {
    /// The scheme a 2xx accepted, if one did.
    pub accepted: Option<SignatureSpec>,
    /// The first scheme of the attempt.
    pub first: Option<SignatureSpec>,
    /// Both schemes were tried and the last was refused too.
    pub refused_both: bool,
}

/// The double-knock of one attempt (see the [module documentation](self)).
#[derive(Clone, Debug)]
pub struct Knock {
    plan: KnockPlan,
    spec: SignatureSpec,
    requests: u8,
    challenged: bool,
    fell_back: bool,
    report: KnockReport,
}

impl Knock {
    /// The knock of an attempt under `plan`.
    pub fn new(plan: KnockPlan) -> Knock {
        Knock {
            plan,
            spec: plan.first,
            requests: 0,
            challenged: false,
            fell_back: false,
            report: KnockReport {
                first: Some(plan.first),
                ..KnockReport::default()
            },
        }
    }

    /// The scheme of the next request.
    pub fn spec(&self) -> SignatureSpec {
        self.spec
    }

    /// The answer to the last request: its status (`None`: no answer at all) and whether it
    /// carried a challenge. Says whether to send again.
    pub fn answered(&mut self, status: Option<u16>, challenge: Challenge) -> KnockStep {
        self.requests = self.requests.saturating_add(1);
        let Some(status) = status else {
            return KnockStep::Done;
        };
        if (200..300).contains(&status) {
            self.report.accepted = Some(self.spec);
            return KnockStep::Done;
        }
        let unknown = !self.plan.known || self.fell_back;
        let refused = matches!(status, 401 | 403)
            || (unknown && (status == 400 || (self.plan.on_5xx && (500..600).contains(&status))));
        if !refused {
            return KnockStep::Done;
        }
        if self.requests < 3
            && challenge == Challenge::Usable
            && self.plan.challenges
            && !self.challenged
        {
            // The server said what it wants (RFC 9421 §5): answered once.
            self.challenged = true;
            self.spec = SignatureSpec::Rfc9421;
            return KnockStep::Again {
                spec: SignatureSpec::Rfc9421,
                challenge: true,
            };
        }
        match self.plan.fallback {
            Some(other) if self.requests < 3 && !self.fell_back && other != self.spec => {
                self.fell_back = true;
                self.spec = other;
                KnockStep::Again {
                    spec: other,
                    challenge: false,
                }
            }
            _ => {
                self.report.refused_both = self.fell_back;
                KnockStep::Done
            }
        }
    }

    /// What the attempt's requests taught.
    pub fn report(&self) -> KnockReport {
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown() -> KnockPlan {
        KnockPlan {
            first: SignatureSpec::Rfc9421,
            fallback: Some(SignatureSpec::Cavage),
            known: false,
            challenges: true,
            on_5xx: false,
        }
    }

    #[test]
    fn an_unknown_host_refusing_rfc9421_gets_cavage_once() {
        let mut k = Knock::new(unknown());
        assert_eq!(k.spec(), SignatureSpec::Rfc9421);
        assert_eq!(
            k.answered(Some(400), Challenge::None),
            KnockStep::Again {
                spec: SignatureSpec::Cavage,
                challenge: false
            }
        );
        assert_eq!(k.answered(Some(202), Challenge::None), KnockStep::Done);
        assert_eq!(k.report().accepted, Some(SignatureSpec::Cavage));
        assert!(!k.report().refused_both);
    }

    #[test]
    fn a_known_host_answering_400_refuses_the_payload_not_the_signature() {
        let plan = KnockPlan {
            known: true,
            ..unknown()
        };
        let mut k = Knock::new(plan);
        assert_eq!(k.answered(Some(400), Challenge::None), KnockStep::Done);
        assert_eq!(
            k.report(),
            KnockReport {
                accepted: None,
                first: Some(SignatureSpec::Rfc9421),
                refused_both: false
            }
        );
        // A 401 is a refusal of the signature whatever is known: the other scheme, once.
        let mut k = Knock::new(plan);
        assert!(matches!(
            k.answered(Some(401), Challenge::None),
            KnockStep::Again { .. }
        ));
        assert_eq!(k.answered(Some(401), Challenge::None), KnockStep::Done);
        assert!(k.report().refused_both);
    }

    #[test]
    fn a_usable_challenge_is_answered_once_and_an_unusable_one_ignored() {
        let mut k = Knock::new(unknown());
        assert_eq!(
            k.answered(Some(401), Challenge::Usable),
            KnockStep::Again {
                spec: SignatureSpec::Rfc9421,
                challenge: true
            }
        );
        assert_eq!(
            k.answered(Some(401), Challenge::Usable),
            KnockStep::Again {
                spec: SignatureSpec::Cavage,
                challenge: false
            }
        );
        assert_eq!(k.answered(Some(401), Challenge::Usable), KnockStep::Done);
        // Garbage: straight to the other scheme, never the same request again.
        let mut k = Knock::new(unknown());
        assert_eq!(
            k.answered(Some(401), Challenge::Unusable),
            KnockStep::Again {
                spec: SignatureSpec::Cavage,
                challenge: false
            }
        );
    }

    #[test]
    fn no_answer_and_5xx_end_the_attempt_unless_asked() {
        let mut k = Knock::new(unknown());
        assert_eq!(k.answered(None, Challenge::None), KnockStep::Done);
        let mut k = Knock::new(unknown());
        assert_eq!(k.answered(Some(503), Challenge::None), KnockStep::Done);
        let mut k = Knock::new(KnockPlan {
            on_5xx: true,
            ..unknown()
        });
        assert!(matches!(
            k.answered(Some(500), Challenge::None),
            KnockStep::Again { .. }
        ));
        let mut k = Knock::new(KnockPlan::once(SignatureSpec::Cavage));
        assert_eq!(k.answered(Some(401), Challenge::Usable), KnockStep::Done);
    }

    #[test]
    fn signing_follows_the_mode_and_the_signer() {
        assert_eq!(Signing::of(SignatureMode::Auto, true), Signing::Auto);
        assert_eq!(
            Signing::of(SignatureMode::Auto, false),
            Signing::Plain(SignatureSpec::Rfc9421)
        );
        assert_eq!(
            Signing::of(SignatureMode::Cavage, true),
            Signing::Fixed(SignatureSpec::Cavage)
        );
        for m in [
            SignatureMode::Auto,
            SignatureMode::Rfc9421,
            SignatureMode::Cavage,
        ] {
            assert_eq!(SignatureMode::from_code(m.as_str()), Some(m));
        }
        for s in [SignatureSpec::Rfc9421, SignatureSpec::Cavage] {
            assert_eq!(SignatureSpec::from_code(s.as_str()), Some(s));
            assert_eq!(s.other().other(), s);
        }
    }
}
