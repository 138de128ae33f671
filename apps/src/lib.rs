//! Applications: SPLASH-2 Water-Nsquared and EM3D, with sequential references.
#![forbid(unsafe_code)]
