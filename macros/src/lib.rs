//! `#[sharded_timer::test]` and `#[sharded_timer::main]`: tokio's `#[tokio::test]` and
//! `#[tokio::main]`, taking the same arguments (`flavor`, `worker_threads`,
//! `start_paused`, `crate`), whose `start_paused = true` pauses sharded-timer's time
//! (`sharded_timer::time::pause`, which pauses tokio's as well) before the body runs.
//! Use them through `sharded_timer` (feature `tokio`), not this crate.
//!
//! The expansion names tokio through `sharded_timer`'s hidden re-export
//! (`::sharded_timer::__private::tokio`), so a user's only dependency is
//! `sharded-timer` with feature `tokio` (which turns on tokio's `rt`,
//! `rt-multi-thread`, `time` and `test-util`); `crate = "path"` names another tokio,
//! as tokio's own attributes allow.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{quote, quote_spanned};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, ItemFn, Lit, Meta, Token};

/// `#[tokio::test]`, with `start_paused = true` pausing sharded-timer's time too.
///
/// Arguments as tokio's: `flavor = "current_thread"` (the default) or
/// `"multi_thread"`, `worker_threads = n` (multi-thread only), `start_paused = bool`
/// (current-thread only), `crate = "path::to::tokio"`.
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args.into(), item.into(), Kind::Test)
        .unwrap_or_else(|error| error.to_compile_error())
        .into()
}

/// `#[tokio::main]`, with `start_paused = true` pausing sharded-timer's time too.
///
/// Arguments as tokio's: `flavor = "multi_thread"` (the default) or
/// `"current_thread"`, `worker_threads = n`, `start_paused = bool` (current-thread
/// only), `crate = "path::to::tokio"`.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(args.into(), item.into(), Kind::Main)
        .unwrap_or_else(|error| error.to_compile_error())
        .into()
}

/// Which attribute.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// `#[test]`: current-thread by default.
    Test,
    /// `main`: multi-thread by default.
    Main,
}

/// The runtime's flavour.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    /// `new_current_thread`.
    CurrentThread,
    /// `new_multi_thread`.
    MultiThread,
}

/// The arguments given.
struct Args {
    /// The flavour, if given.
    flavor: Option<Flavor>,
    /// `worker_threads`, if given.
    worker_threads: Option<Expr>,
    /// `start_paused`.
    start_paused: bool,
    /// The path of tokio.
    tokio: syn::Path,
}

/// The string or integer or bool of `name = value`.
fn literal(meta: &syn::MetaNameValue) -> syn::Result<&Lit> {
    match &meta.value {
        Expr::Lit(ExprLit { lit, .. }) => Ok(lit),
        other => Err(syn::Error::new_spanned(other, "expected a literal")),
    }
}

/// Parses the attribute's arguments.
fn parse_args(args: TokenStream2) -> syn::Result<Args> {
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    let mut parsed = Args {
        flavor: None,
        worker_threads: None,
        start_paused: false,
        tokio: syn::parse_quote!(::sharded_timer::__private::tokio),
    };
    for meta in metas {
        let Meta::NameValue(meta) = meta else {
            return Err(syn::Error::new_spanned(meta, "expected `name = value`"));
        };
        let name = meta
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        match name.as_str() {
            "flavor" => {
                let Lit::Str(flavor) = literal(&meta)? else {
                    return Err(syn::Error::new_spanned(&meta.value, "expected a string"));
                };
                parsed.flavor = Some(match flavor.value().as_str() {
                    "current_thread" => Flavor::CurrentThread,
                    "multi_thread" => Flavor::MultiThread,
                    other => {
                        return Err(syn::Error::new_spanned(
                            flavor,
                            format!(
                            "no such runtime flavor `{other}`: `current_thread` or `multi_thread`"
                        ),
                        ))
                    }
                });
            }
            "worker_threads" => parsed.worker_threads = Some(meta.value),
            "start_paused" => {
                let Lit::Bool(paused) = literal(&meta)? else {
                    return Err(syn::Error::new_spanned(
                        &meta.value,
                        "expected `true` or `false`",
                    ));
                };
                parsed.start_paused = paused.value;
            }
            "crate" => {
                let Lit::Str(path) = literal(&meta)? else {
                    return Err(syn::Error::new_spanned(
                        &meta.value,
                        "expected a path in a string",
                    ));
                };
                parsed.tokio = path.parse()?;
            }
            _ => {
                return Err(syn::Error::new_spanned(
                    &meta.path,
                    "unknown argument: `flavor`, `worker_threads`, `start_paused` or `crate`",
                ))
            }
        }
    }
    Ok(parsed)
}

/// The expansion: a synchronous function that builds the runtime and blocks on the
/// body, pausing time first if asked.
fn expand(args: TokenStream2, item: TokenStream2, kind: Kind) -> syn::Result<TokenStream2> {
    let args = parse_args(args)?;
    let mut function: ItemFn = syn::parse2(item)?;
    if function.sig.asyncness.take().is_none() {
        return Err(syn::Error::new_spanned(
            function.sig.fn_token,
            "the `async` keyword is missing from the function declaration",
        ));
    }
    if kind == Kind::Test && !function.sig.inputs.is_empty() {
        return Err(syn::Error::new_spanned(
            &function.sig.inputs,
            "a test function takes no arguments",
        ));
    }
    let default = match kind {
        Kind::Test => Flavor::CurrentThread,
        Kind::Main => Flavor::MultiThread,
    };
    let flavor = args.flavor.unwrap_or(default);
    let tokio = &args.tokio;
    let mut builder = match flavor {
        Flavor::CurrentThread => {
            if let Some(threads) = &args.worker_threads {
                return Err(syn::Error::new_spanned(
                    threads,
                    "`worker_threads` needs `flavor = \"multi_thread\"`",
                ));
            }
            quote! { #tokio::runtime::Builder::new_current_thread() }
        }
        Flavor::MultiThread => {
            if args.start_paused {
                return Err(syn::Error::new(
                    Span::call_site(),
                    "`start_paused` needs `flavor = \"current_thread\"`",
                ));
            }
            quote! { #tokio::runtime::Builder::new_multi_thread() }
        }
    };
    if let Some(threads) = &args.worker_threads {
        builder = quote! { #builder.worker_threads(#threads) };
    }
    if args.start_paused {
        // Tokio's clock paused as the runtime is built, as tokio's attribute does, so
        // that its tick grid starts where both clocks start.
        builder = quote! { #builder.start_paused(true) };
    }
    let start_paused = args.start_paused;
    let body = &function.block;
    let output = &function.sig.output;
    let span = body_span(&function);
    let run = quote_spanned! {span=>
        let body = async move {
            ::sharded_timer::time::__pause_if(#start_paused);
            #body
        };
        #[allow(clippy::expect_used, clippy::diverging_sub_expression, reason = "as tokio's attributes")]
        {
            return #builder
                .enable_all()
                .build()
                .expect("Failed building the Runtime")
                .block_on(body);
        }
    };
    function.block = syn::parse2(quote! { { #run } })?;
    let attributes = match kind {
        Kind::Test => quote! { #[::core::prelude::v1::test] },
        Kind::Main => quote! {},
    };
    let _ = output;
    Ok(quote! {
        #attributes
        #function
    })
}

/// Where the body's tokens point, for the expansion's errors.
fn body_span(function: &ItemFn) -> Span {
    function
        .block
        .stmts
        .last()
        .map_or_else(Span::call_site, |statement| {
            syn::spanned::Spanned::span(statement)
        })
}
