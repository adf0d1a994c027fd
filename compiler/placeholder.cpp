// Placeholder until the first compiler source lands.
